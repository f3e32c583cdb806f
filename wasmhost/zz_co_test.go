package wasmhost

import (
	"bufio"
	"context"
	"net"
	"testing"
)

func cannedBackend(b *testing.B) string {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	b.Cleanup(func() { ln.Close() })
	resp := []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nDate: Fri, 27 Nov 2026 09:12:25 GMT\r\nContent-Length: 120\r\n\r\n" + string(make([]byte, 120)))
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				br := bufio.NewReader(c)
				for {
					n := 0
					for {
						l, err := br.ReadSlice('\n')
						if err != nil {
							return
						}
						if len(l) <= 2 {
							break
						}
						if len(l) > 16 && (l[0]|0x20) == 'c' && (l[8]|0x20) == 'l' {
							for _, ch := range l[15:] {
								if ch >= '0' && ch <= '9' {
									n = n*10 + int(ch-'0')
								}
							}
						}
					}
					br.Discard(n)
					c.Write(resp)
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

func BenchmarkZZCallout(b *testing.B) {
	h := newHost(b, Options{Workers: 1, Clusters: map[string]string{"backend": cannedBackend(b)}})
	info := RequestInfo{Method: "GET", Path: "/", Headers: [][2]string{{"x-mode", "callout"}, {"x-callout-path", "/b"}}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		s := h.NewStream(ctx, info)
		r, err := s.RequestHeaders(ctx)
		if err != nil || r.Local != nil {
			b.Fatal(err, r.Local)
		}
		s.Close()
	}
}
