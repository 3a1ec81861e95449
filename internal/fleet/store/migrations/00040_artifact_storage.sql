-- +goose Up
-- Blobs in an S3-compatible store: the object key of the verified blob
-- (artifact_blobs.store = 's3'). An object without its row is garbage that
-- the prefetcher's retention deletes.
ALTER TABLE artifact_blobs ADD COLUMN object_key text;

-- Resumable downloads into PostgreSQL: the large object is committed in
-- segments, and each segment records how many bytes it holds and the
-- serialized sha256 state after them, so that a new leader continues with
-- a Range request instead of starting from byte 0. The source's validators
-- (ETag, Last-Modified) tell whether the bytes already written still
-- belong to the same content. term is the term of the job that owns the
-- download; a segment commits only while the row still names that term.
ALTER TABLE artifact_downloads
    ADD COLUMN store         text NOT NULL DEFAULT 'pg',
    ADD COLUMN lo_oid        oid,
    ADD COLUMN written       bigint NOT NULL DEFAULT 0,
    ADD COLUMN hash_state    bytea,
    ADD COLUMN source_etag   text NOT NULL DEFAULT '',
    ADD COLUMN source_last_modified text NOT NULL DEFAULT '',
    ADD COLUMN resumed_from  bigint NOT NULL DEFAULT 0;

-- +goose Down
SELECT lo_unlink(lo_oid) FROM artifact_downloads WHERE lo_oid IS NOT NULL
    AND lo_oid IN (SELECT oid FROM pg_largeobject_metadata)
    AND lo_oid NOT IN (SELECT lo_oid FROM artifact_blobs WHERE lo_oid IS NOT NULL);
ALTER TABLE artifact_downloads DROP COLUMN store, DROP COLUMN lo_oid, DROP COLUMN written, DROP COLUMN hash_state,
    DROP COLUMN source_etag, DROP COLUMN source_last_modified, DROP COLUMN resumed_from;
ALTER TABLE artifact_blobs DROP COLUMN object_key;
