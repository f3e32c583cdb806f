package wasmhost

import (
	"bufio"
	"net"
	"testing"

	"github.com/sluicehq/sluice/wasmhost/internal/fields"
)

func BenchmarkZZH1Do(b *testing.B) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
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
					// read request head + body of 200 bytes
					n := -1
					for {
						l, err := br.ReadSlice('\n')
						if err != nil {
							return
						}
						if len(l) <= 2 {
							break
						}
						if len(l) > 16 && (l[0] == 'C' || l[0] == 'c') && l[8] == 'L' {
							n = 200
						}
					}
					if n > 0 {
						br.Discard(n)
					}
					c.Write(resp)
				}
			}()
		}
	}()
	c := &h1client{idle: map[string][]*h1conn{}, busy: map[*h1conn]struct{}{}}
	body := make([]byte, 200)
	r := &h1Request{addr: ln.Addr().String(), method: "POST", path: "/v1/check", authority: "sluice-bridge",
		headers: fields.Map{{"content-type", "application/json"}, {"x-request-id", "0123456789abcdef0123456789abcdef"}}, body: body}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, _, err := c.do(r, 1<<20); err != nil {
			b.Fatal(err)
		}
	}
}
