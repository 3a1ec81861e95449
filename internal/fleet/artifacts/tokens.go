package artifacts

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Download tokens
//
// A package offer (OpAMP DownloadableFile) carries the headers the agent
// sends with its download. It cannot carry the agent's own credential: the
// store keeps only its hash. It must not carry the enrollment secret
// either: that is shared by the whole fleet, so every agent that ever
// received an offer could then download anything, and revoking one agent
// would not stop it. So each offer carries a download token:
//
//	myd_<key id>.<expiry, unix seconds>.<instance uid>.<mac>
//
// where mac = HMAC-SHA256(key, TokenDomain, key id, expiry, uid, digest),
// base64url. The token names its agent but not its blob: the digest is the
// one in the request's path, so a token works for exactly the artifact it
// was offered for. The keys live in the database (artifact_download_keys)
// so that a token issued by one replica is accepted by every other; the
// newest key signs, a key is replaced after KeyRotateAfter, and an old key
// verifies only for as long as tokens it signed can live. The endpoint
// checks, per request: MAC, expiry, and that the agent is not revoked (one
// query); a forged or expired token costs no query.
//
// A token is only as secret as the offer that carries it (the OpAMP
// connection, TLS in production); one that leaks lets its holder fetch that
// one artifact until it expires, which is why tokens are short-lived and
// bound to the digest.

// TokenPrefix starts every download token.
const TokenPrefix = "myd_"

// TokenTTL is how long a download token is valid after the offer that
// carries it was built. A download that started in time finishes (the
// check is per request); a new connection gets a new offer and token.
const TokenTTL = time.Hour

// KeyRotateAfter is the age after which a new key signs the tokens.
const KeyRotateAfter = 30 * 24 * time.Hour

// TokenDomain separates the MAC of a download token from any other use
// of the key.
const TokenDomain = "myriarch artifact download v1"

// keyRetireAfter is when a key stops verifying: it signed until
// KeyRotateAfter, and its last tokens live TokenTTL longer.
const keyRetireAfter = KeyRotateAfter + TokenTTL + time.Minute

// keyReloadEvery bounds how often a token with an unknown key id makes a
// replica read the keys again (a key created by another replica).
const keyReloadEvery = 10 * time.Second

// Tokens issues and verifies download tokens. Safe for concurrent use.
type Tokens struct {
	pool *pgxpool.Pool
	// Now is the clock; tests move it.
	Now func() time.Time

	mu       sync.Mutex
	keys     map[int64]dlKey
	loadedAt time.Time
}

type dlKey struct {
	key     []byte
	created time.Time
}

// NewTokens returns the token issuer and checker of the replica whose
// database is pool.
func NewTokens(pool *pgxpool.Pool) *Tokens {
	return &Tokens{pool: pool, Now: time.Now, keys: map[int64]dlKey{}}
}

// Issue returns a token with which agent uid may download the blob digest
// until TokenTTL from now.
func (t *Tokens) Issue(ctx context.Context, uid, digest string) (string, error) {
	id, k, err := t.signingKey(ctx)
	if err != nil {
		return "", fmt.Errorf("download token key: %w", err)
	}
	exp := t.Now().Add(TokenTTL).Unix()
	return TokenPrefix + strconv.FormatInt(id, 10) + "." + strconv.FormatInt(exp, 10) + "." + uid + "." + tokenMAC(k, id, exp, uid, digest), nil
}

// Verify checks that tok is a valid, unexpired download token for digest
// and returns the instance UID it was issued to. A token that is refused
// gives an error wrapping ErrUnauthorized; other errors are failures to
// read the keys. Whether the agent is revoked is the caller's check.
func (t *Tokens) Verify(ctx context.Context, tok, digest string) (string, error) {
	bad := func(why string) (string, error) { return "", fmt.Errorf("%w: download token %s", ErrUnauthorized, why) }
	rest, ok := strings.CutPrefix(tok, TokenPrefix)
	if !ok {
		return bad("malformed")
	}
	kid, rest, ok1 := strings.Cut(rest, ".")
	exps, rest, ok2 := strings.Cut(rest, ".")
	i := strings.LastIndexByte(rest, '.')
	if !ok1 || !ok2 || i <= 0 {
		return bad("malformed")
	}
	uid, mac := rest[:i], rest[i+1:]
	id, err1 := strconv.ParseInt(kid, 10, 64)
	exp, err2 := strconv.ParseInt(exps, 10, 64)
	if err1 != nil || err2 != nil {
		return bad("malformed")
	}
	now := t.Now()
	switch {
	case !validDigest(digest):
		return bad("used for a path that is not an artifact")
	case now.Unix() > exp:
		return bad("expired")
	case exp > now.Add(TokenTTL+time.Minute).Unix():
		// Longer than any token this code issues.
		return bad("valid for too long")
	}
	k, ok, err := t.key(ctx, id)
	if err != nil {
		return "", fmt.Errorf("download token key: %w", err)
	}
	if !ok || now.Sub(k.created) > keyRetireAfter {
		return bad("signed by an unknown or retired key")
	}
	if !hmac.Equal([]byte(mac), []byte(tokenMAC(k.key, id, exp, uid, digest))) {
		return bad("not valid for this agent and artifact")
	}
	return uid, nil
}

func validDigest(d string) bool {
	h, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(h) != 64 {
		return false
	}
	for _, c := range h {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func tokenMAC(key []byte, id, exp int64, uid, digest string) string {
	m := hmac.New(sha256.New, key)
	fmt.Fprintf(m, "%s\n%d\n%d\n%s\n%s", TokenDomain, id, exp, uid, digest)
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// key returns the key id, reading the keys again (at most every
// keyReloadEvery) when it is not known here.
func (t *Tokens) key(ctx context.Context, id int64) (dlKey, bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if k, ok := t.keys[id]; ok {
		return k, true, nil
	}
	if t.Now().Sub(t.loadedAt) < keyReloadEvery {
		return dlKey{}, false, nil
	}
	if err := t.load(ctx); err != nil {
		return dlKey{}, false, err
	}
	k, ok := t.keys[id]
	return k, ok, nil
}

// signingKey returns the newest key, creating the first one, or the next
// one when the newest is older than KeyRotateAfter. Two replicas that
// create a key at once agree on it: the id is the primary key.
func (t *Tokens) signingKey(ctx context.Context) (int64, []byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if id, k, ok := t.newest(); ok && t.Now().Sub(k.created) < KeyRotateAfter {
		return id, k.key, nil
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, nil, err
	}
	// The replica's clock, as for the tokens' expiry: replicas' clocks
	// agree to far better than the key's lifetime.
	now := t.Now()
	err := pgx.BeginFunc(ctx, t.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO artifact_download_keys (id, key, created_at)
			SELECT coalesce(max(id), 0) + 1, $1, $2 FROM artifact_download_keys
			HAVING coalesce(max(created_at) > $3, false) = false
			ON CONFLICT (id) DO NOTHING`, b[:], now, now.Add(-KeyRotateAfter)); err != nil {
			return err
		}
		// Keys that can no longer verify a live token.
		_, err := tx.Exec(ctx, `DELETE FROM artifact_download_keys
			WHERE id < (SELECT max(id) FROM artifact_download_keys) AND created_at < $1`, now.Add(-keyRetireAfter))
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	if err := t.load(ctx); err != nil {
		return 0, nil, err
	}
	id, k, ok := t.newest()
	if !ok {
		return 0, nil, errors.New("no key in artifact_download_keys after creating one")
	}
	return id, k.key, nil
}

// newest is the key with the highest id; the caller holds mu.
func (t *Tokens) newest() (int64, dlKey, bool) {
	var id int64 = -1
	for i := range t.keys {
		id = max(id, i)
	}
	k, ok := t.keys[id]
	return id, k, ok
}

// load reads every key; the caller holds mu.
func (t *Tokens) load(ctx context.Context) error {
	rows, err := t.pool.Query(ctx, `SELECT id, key, created_at FROM artifact_download_keys`)
	if err != nil {
		return err
	}
	keys := map[int64]dlKey{}
	var id int64
	var k dlKey
	if _, err := pgx.ForEachRow(rows, []any{&id, &k.key, &k.created}, func() error {
		keys[id] = dlKey{key: append([]byte(nil), k.key...), created: k.created}
		return nil
	}); err != nil {
		return err
	}
	t.keys, t.loadedAt = keys, t.Now()
	return nil
}
