package s3test

import (
	"net/http"
	"sync/atomic"
)

type countingHandler struct {
	h http.Handler
	n *atomic.Int64
}

func (c countingHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.n.Add(1)
	c.h.ServeHTTP(w, r)
}
