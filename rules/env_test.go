package rules

import (
	"errors"
	"fmt"
	"testing"
)

func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

func TestParseConfigEnv(t *testing.T) {
	const cfg = `{"categories":[{"name":"chat","paths":["/c"]},{"name":"auth","paths":["/a"],"window":"5m"},{"name":"misc","paths":["/m"],"limit":4,"window":"1s"}]}`
	tests := []struct {
		name       string
		env        map[string]string
		chat, auth [2]int64 // limit, window ms
	}{
		{"none", nil, [2]int64{10, 60_000}, [2]int64{5, 300_000}},
		{"seconds", map[string]string{"RATE_LIMIT_CHAT_REQUESTS": "20", "RATE_LIMIT_CHAT_WINDOW": "120"}, [2]int64{20, 120_000}, [2]int64{5, 300_000}},
		{"duration", map[string]string{"RATE_LIMIT_CHAT_WINDOW": "1h30m"}, [2]int64{10, 5400_000}, [2]int64{5, 300_000}},
		{"config wins", map[string]string{"RATE_LIMIT_AUTH_REQUESTS": "50", "RATE_LIMIT_AUTH_WINDOW": "10"}, [2]int64{10, 60_000}, [2]int64{50, 300_000}},
		{"empty is unset", map[string]string{"RATE_LIMIT_CHAT_REQUESTS": ""}, [2]int64{10, 60_000}, [2]int64{5, 300_000}},
		{"unused category", map[string]string{"RATE_LIMIT_UPLOAD_REQUESTS": "9"}, [2]int64{10, 60_000}, [2]int64{5, 300_000}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfigEnv([]byte(cfg), envOf(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			for i, want := range [][2]int64{tc.chat, tc.auth, {4, 1000}} {
				s := c.Categories[i].Spec
				if s.Limit != want[0] || s.WindowMS != want[1] || s.Burst != s.Limit {
					t.Errorf("%s: limit %d burst %d window %dms, want %d per %dms", c.Categories[i].Name, s.Limit, s.Burst, s.WindowMS, want[0], want[1])
				}
			}
		})
	}
}

func TestParseConfigEnv_Errors(t *testing.T) {
	for _, tc := range []struct{ name, value, msg string }{
		{"RATE_LIMIT_CHAT_REQUESTS", "0", `RATE_LIMIT_CHAT_REQUESTS: must be a whole number of requests from 1 to 1099511627776, got "0"`},
		{"RATE_LIMIT_CHAT_REQUESTS", "ten", `RATE_LIMIT_CHAT_REQUESTS: must be a whole number of requests from 1 to 1099511627776, got "ten"`},
		{"RATE_LIMIT_UPLOAD_WINDOW", "1.5", `RATE_LIMIT_UPLOAD_WINDOW: must be a whole number of seconds ("60") or a duration ("1m"), from 1s to a year, got "1.5"`},
		{"RATE_LIMIT_AUTH_WINDOW", "500ms", `RATE_LIMIT_AUTH_WINDOW: must be a whole number of seconds ("60") or a duration ("1m"), from 1s to a year, got "500ms"`},
		{"RATE_LIMIT_AUTH_WINDOW", "-60", `RATE_LIMIT_AUTH_WINDOW: must be a whole number of seconds ("60") or a duration ("1m"), from 1s to a year, got "-60"`},
	} {
		// Refused even though the configuration has no categories at all.
		_, err := ParseConfigEnv([]byte(`{}`), envOf(map[string]string{tc.name: tc.value}))
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Path != tc.name || err.Error() != tc.msg {
			t.Errorf("%s=%q: %v, want %s", tc.name, tc.value, err, tc.msg)
		}
	}
}

func ExampleParseConfigEnv() {
	env := map[string]string{"RATE_LIMIT_CHAT_REQUESTS": "30", "RATE_LIMIT_CHAT_WINDOW": "60"}
	lookup := func(name string) (string, bool) { v, ok := env[name]; return v, ok } // os.LookupEnv in a real program
	c, err := ParseConfigEnv([]byte(`{"categories":[{"name":"chat","paths":["/api/v1/chat/**"]}]}`), lookup)
	if err != nil {
		fmt.Println(err)
		return
	}
	s := c.Categories[0].Spec
	fmt.Println(s.Limit, "per", FormatDurationMS(s.WindowMS))
	// Output: 30 per 1m
}
