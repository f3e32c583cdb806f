// Command demo-upstream is the application `make run` puts behind the
// gateway: it answers every request with a small JSON echo, and
// /status/NNN with that status, to show rate limit headers on errors too.
package main

import (
	"flag"
	"fmt"
	"log"
	"net/http"
	"strconv"
	"strings"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:9000", "address to serve on")
	flag.Parse()
	srv := &http.Server{Addr: *listen, Handler: handler(), ReadHeaderTimeout: 5 * time.Second}
	log.Printf("demo upstream listening on %s", *listen)
	log.Fatal(srv.ListenAndServe())
}

func handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status := http.StatusOK
		if code, ok := strings.CutPrefix(r.URL.Path, "/status/"); ok {
			if n, err := strconv.Atoi(code); err == nil && n >= 200 && n <= 599 {
				status = n
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintf(w, "{\"upstream\":\"demo\",\"method\":%q,\"path\":%q,\"status\":%d}\n", r.Method, r.URL.Path, status)
	})
}
