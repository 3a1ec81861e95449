-- +goose Up
-- Package sources of the release tracker, one row per package.
CREATE TABLE package_sources (
    name           text PRIMARY KEY,
    type           text NOT NULL CHECK (type IN ('oci', 'github')),
    source         text NOT NULL,
    constraint_expr text NOT NULL DEFAULT '',
    poll_interval_ms bigint NOT NULL,
    -- Public key (ed25519, base64) that signs the assets; empty = digest only.
    public_key     text NOT NULL DEFAULT '',
    last_polled_at timestamptz,
    last_error     text NOT NULL DEFAULT '',
    created_at     timestamptz NOT NULL DEFAULT now()
);

-- Releases seen by the tracker; assets per OS/arch.
CREATE TABLE package_releases (
    package      text NOT NULL REFERENCES package_sources (name) ON DELETE CASCADE,
    version      text NOT NULL,
    published_at timestamptz NOT NULL,
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    term         bigint NOT NULL,
    PRIMARY KEY (package, version)
);

CREATE TABLE package_assets (
    package   text NOT NULL,
    version   text NOT NULL,
    name      text NOT NULL,
    os        text NOT NULL DEFAULT '',
    arch      text NOT NULL DEFAULT '',
    -- digest is "sha256:<hex>", the address of the blob once prefetched.
    digest    text NOT NULL,
    size      bigint NOT NULL DEFAULT -1,
    url       text NOT NULL,
    signature text NOT NULL DEFAULT '',
    PRIMARY KEY (package, version, name),
    FOREIGN KEY (package, version) REFERENCES package_releases (package, version) ON DELETE CASCADE
);
CREATE INDEX package_assets_digest ON package_assets (digest);

-- Verified blobs, stored once by digest. A row exists only for a blob whose
-- bytes were completely written and verified in the same transaction.
CREATE TABLE artifact_blobs (
    digest     text PRIMARY KEY,
    store      text NOT NULL DEFAULT 'pg',
    lo_oid     oid,
    size       bigint NOT NULL,
    stored_at  timestamptz NOT NULL DEFAULT now(),
    term       bigint NOT NULL
);

-- Progress of running and failed downloads (the leader writes it).
CREATE TABLE artifact_downloads (
    digest      text PRIMARY KEY,
    package     text NOT NULL,
    version     text NOT NULL,
    asset       text NOT NULL,
    state       text NOT NULL CHECK (state IN ('downloading', 'failed', 'done')),
    bytes       bigint NOT NULL DEFAULT 0,
    total       bigint NOT NULL DEFAULT -1,
    attempts    bigint NOT NULL DEFAULT 0,
    error       text NOT NULL DEFAULT '',
    replica_id  text NOT NULL DEFAULT '',
    term        bigint NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE artifact_downloads;
SELECT lo_unlink(lo_oid) FROM artifact_blobs WHERE lo_oid IS NOT NULL;
DROP TABLE artifact_blobs;
DROP TABLE package_assets;
DROP TABLE package_releases;
DROP TABLE package_sources;
