package rules

import "time"

// FixedWindowIndex is the index of s's fixed window that holds nowMS
// (unix ms): windows of WindowMS from the Unix epoch, or of Months
// calendar months (UTC) from January 1970. The bridge's script computes
// the same in Lua (check.lua, fwIndex).
func (s *LimitSpec) FixedWindowIndex(nowMS int64) int64 {
	if s.Months == 0 {
		return nowMS / s.WindowMS
	}
	t := time.UnixMilli(nowMS).UTC()
	return ((int64(t.Year())-1970)*12 + int64(t.Month()) - 1) / s.Months
}

// FixedWindowStart is when s's fixed window idx starts, in unix ms
// (check.lua, fwStart).
func (s *LimitSpec) FixedWindowStart(idx int64) int64 {
	if s.Months == 0 {
		return idx * s.WindowMS
	}
	// time.Date carries months past December into the years after.
	return time.Date(1970, time.Month(idx*s.Months+1), 1, 0, 0, 0, 0, time.UTC).UnixMilli()
}
