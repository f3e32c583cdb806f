package redistest

import (
	"testing"
)

func TestDo_Replies(t *testing.T) {
	s := Start(t)
	for _, tc := range []struct {
		args []string
		want any
	}{
		{[]string{"SET", "k", "v"}, "OK"},
		{[]string{"GET", "k"}, "v"},
		{[]string{"GET", "missing"}, nil},
		{[]string{"INCR", "n"}, "1"},
	} {
		got, err := Do(s.Addr, opTimeout, tc.args...)
		if err != nil || got != tc.want {
			t.Errorf("%v: %v %v, want %v", tc.args, got, err, tc.want)
		}
	}
	if _, err := Do(s.Addr, opTimeout, "INCR", "k"); err == nil {
		t.Error("INCR on a string: no error")
	}
	if v, err := Do(s.Addr, opTimeout, "KEYS", "*"); err != nil || len(v.([]any)) != 2 {
		t.Errorf("KEYS: %v %v", v, err)
	}
}
