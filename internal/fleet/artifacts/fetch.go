package artifacts

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/myriarch/myriarch/internal/fleet/releases"
)

// source is the open content stream of an asset.
type source struct {
	body io.ReadCloser
	// from is the offset of the body's first byte.
	from          int64
	etag, lastMod string
}

// fetcher opens the content of assets at their sources, continuing a
// download where a previous attempt stopped when the source allows it.
type fetcher struct {
	client *http.Client
}

// open returns the asset's content from offset when the source can
// continue there (a 206 for the same content), else from byte 0.
func (f fetcher) open(ctx context.Context, a releases.Asset, offset int64, etag, lastMod string) (source, error) {
	// OCI assets are addressed as repository@digest; others are plain URLs.
	if strings.Contains(a.URL, "@sha256:") {
		rc, err := releases.OpenOCI(ctx, f.client, a.URL, a.Size)
		return source{body: rc}, err
	}
	get := func(offset int64) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.URL, nil)
		if err != nil {
			return nil, err
		}
		if offset > 0 {
			req.Header.Set("Range", fmt.Sprintf("bytes=%d-", offset))
			// The source answers 200 (the whole content) if it changed.
			if etag != "" && !strings.HasPrefix(etag, "W/") {
				req.Header.Set("If-Range", etag)
			} else if lastMod != "" {
				req.Header.Set("If-Range", lastMod)
			}
		}
		return f.client.Do(req)
	}
	resp, err := get(offset)
	if err != nil {
		return source{}, err
	}
	if offset > 0 && resp.StatusCode == http.StatusRequestedRangeNotSatisfiable {
		// Nothing after offset (every byte of an asset of unrecorded size
		// was committed) or a shorter content: start again, simply.
		resp.Body.Close()
		if resp, err = get(0); err != nil {
			return source{}, err
		}
	} else if offset > 0 && resp.StatusCode == http.StatusPartialContent {
		same := resp.Header.Get("ETag") == etag && resp.Header.Get("Last-Modified") == lastMod
		if start, ok := contentRangeStart(resp.Header.Get("Content-Range")); ok && start == offset && same {
			return source{body: resp.Body, from: offset, etag: etag, lastMod: lastMod}, nil
		}
		// Not the continuation of the same content: start again.
		resp.Body.Close()
		if resp, err = get(0); err != nil {
			return source{}, err
		}
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return source{}, fmt.Errorf("GET %s: %s", a.URL, resp.Status)
	}
	return source{body: resp.Body, etag: resp.Header.Get("ETag"), lastMod: resp.Header.Get("Last-Modified")}, nil
}

// contentRangeStart parses the first byte of "bytes first-last/total".
func contentRangeStart(v string) (int64, bool) {
	r, ok := strings.CutPrefix(v, "bytes ")
	if !ok {
		return 0, false
	}
	first, _, ok := strings.Cut(r, "-")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(first, 10, 64)
	return n, err == nil
}
