package unixaddr

import "testing"

func TestPath(t *testing.T) {
	for _, tc := range []struct {
		addr, path string
		ok         bool
		err        string
	}{
		{"unix:///run/sluice/bridge.sock", "/run/sluice/bridge.sock", true, ""},
		{"unix://bridge.sock", "", false, `"unix://bridge.sock": a Unix socket needs an absolute path, unix:///run/sluice/bridge.sock`},
		{"unix://", "", false, `"unix://": a Unix socket needs an absolute path, unix:///run/sluice/bridge.sock`},
		{"http://127.0.0.1:8081", "", false, ""},
		{":8081", "", false, ""},
	} {
		path, ok := Path(tc.addr)
		err := ""
		if e := Check(tc.addr); e != nil {
			err = e.Error()
		}
		if path != tc.path || ok != tc.ok || err != tc.err {
			t.Errorf("%q: Path %q %v, Check %q; want %q %v, %q", tc.addr, path, ok, err, tc.path, tc.ok, tc.err)
		}
	}
}
