package rules

// Durations as configuration writes them: "250ms", "30s", "1m", "1h", "1d".

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
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

// Calendar windows: a limit's window of "1mo", "2mo", "3mo", "4mo", "6mo"
// or "12mo" is calendar months in UTC (see LimitSpec.Months); a number
// of months that divides a year, so that each year starts a window.
const (
	MaxWindowMonths = 12
	// MonthMS is a calendar month's nominal length, where a window needs
	// one (a penalty's block, RateLimit-Policy): 30.5 days, so that twelve
	// are MaxWindowMS. Windows themselves end on the 1st.
	MonthMS = MaxWindowMS / MaxWindowMonths
)

// ParseWindow parses a limit's window: a duration (ParseDurationMS), or
// calendar months ("1mo"), returned as months with ms their nominal
// length.
func ParseWindow(s string) (ms, months int64, err error) {
	if n, ok := strings.CutSuffix(s, "mo"); ok && n != "" && strings.Trim(n, "0123456789") == "" {
		months, _ = strconv.ParseInt(n, 10, 64)
		if !ValidMonths(months) || n[0] == '0' {
			return 0, 0, fmt.Errorf(`invalid window %q: calendar months are "1mo", "2mo", "3mo", "4mo", "6mo" or "12mo"`, s)
		}
		return months * MonthMS, months, nil
	}
	ms, err = ParseDurationMS(s)
	return ms, 0, err
}

// ValidMonths tells whether a window may hold n calendar months: n
// divides a year.
func ValidMonths(n int64) bool { return n >= 1 && n <= MaxWindowMonths && MaxWindowMonths%n == 0 }

// AppendWindow appends s's window as configuration writes it: "1mo" for
// a calendar month, else as AppendDurationMS.
func (s *LimitSpec) AppendWindow(dst []byte) []byte {
	if s.Months > 0 {
		return append(strconv.AppendInt(dst, s.Months, 10), "mo"...)
	}
	return AppendDurationMS(dst, s.WindowMS)
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
