package rules

// Durations as configuration writes them: "250ms", "30s", "1m", "1h", "1d".

import (
	"errors"
	"fmt"
	"strconv"
)

// ParseDurationMS parses "250ms", "30s", "1m", "1h", "1d" (and combinations
// such as "1m30s") into milliseconds. Sub-millisecond precision is refused
// rather than rounded.
func ParseDurationMS(s string) (int64, error) {
	if s == "" {
		return 0, errors.New(`empty duration (use e.g. "30s", "1m")`)
	}
	var total int64
	rest := s
	for rest != "" {
		i := 0
		for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
			i++
		}
		if i == 0 || i > 12 {
			return 0, fmt.Errorf("invalid duration %q (use e.g. \"500ms\", \"30s\", \"1m\", \"1h\", \"1d\")", s)
		}
		n, _ := strconv.ParseInt(rest[:i], 10, 64)
		rest = rest[i:]
		j := 0
		for j < len(rest) && (rest[j] < '0' || rest[j] > '9') {
			j++
		}
		var unit int64
		switch rest[:j] {
		case "ms":
			unit = 1
		case "s":
			unit = 1000
		case "m":
			unit = 60_000
		case "h":
			unit = 3600_000
		case "d":
			unit = 86400_000
		default:
			return 0, fmt.Errorf("invalid duration %q: unit %q (use ms, s, m, h or d)", s, rest[:j])
		}
		rest = rest[j:]
		total += n * unit
		if total > MaxWindowMS*10 {
			return 0, fmt.Errorf("duration %q is too long", s)
		}
	}
	return total, nil
}

// FormatDurationMS renders ms in the largest whole unit: 60000 → "1m".
func FormatDurationMS(ms int64) string { return string(AppendDurationMS(nil, ms)) }

// AppendDurationMS appends ms as FormatDurationMS does.
func AppendDurationMS(dst []byte, ms int64) []byte {
	for _, u := range [...]struct {
		n    int64
		unit byte
	}{{86400_000, 'd'}, {3600_000, 'h'}, {60_000, 'm'}, {1000, 's'}} {
		if ms >= u.n && ms%u.n == 0 {
			return append(strconv.AppendInt(dst, ms/u.n, 10), u.unit)
		}
	}
	return append(strconv.AppendInt(dst, ms, 10), "ms"...)
}
