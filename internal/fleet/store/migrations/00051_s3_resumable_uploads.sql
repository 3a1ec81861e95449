-- +goose Up
-- Resumable downloads into S3: the download keeps its multipart upload open
-- across leaders. Each completed part is recorded here with the bytes and
-- the sha256 state after it (written, hash_state), under the same row lock
-- and term check as the segments of a large object, so that a new leader
-- lists the upload's parts, checks them against these and continues with a
-- Range request. s3_parts is a JSON array of {"n", "etag", "size"}.
ALTER TABLE artifact_downloads
    ADD COLUMN s3_key       text,
    ADD COLUMN s3_upload_id text,
    ADD COLUMN s3_parts     jsonb;

-- +goose Down
ALTER TABLE artifact_downloads DROP COLUMN s3_key, DROP COLUMN s3_upload_id, DROP COLUMN s3_parts;
