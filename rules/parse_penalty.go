package rules

// Parsing of penalties: longer blocks for clients that keep violating a limit.

import "github.com/tidwall/gjson"

func (p *parser) penalty(v gjson.Result, path string, inherit *Penalty) Penalty {
	pen := Penalty{DetectionWindowMS: 3600_000, ViolationThreshold: 3, Multipliers: []int64{1, 2, 4, 8}}
	if inherit != nil {
		pen = *inherit
	}
	if !v.Exists() {
		return pen
	}
	if !p.object(v, path, "enabled", "detection_window", "violation_threshold", "multipliers") {
		return pen
	}
	pen.Enabled = p.boolean(v.Get("enabled"), join(path, "enabled"), true)
	pen.DetectionWindowMS = p.duration(v.Get("detection_window"), join(path, "detection_window"), pen.DetectionWindowMS, 1000, MaxWindowMS)
	pen.ViolationThreshold = p.integer(v.Get("violation_threshold"), join(path, "violation_threshold"), pen.ViolationThreshold, 1, MaxViolations)
	if m := v.Get("multipliers"); m.Exists() {
		mp := join(path, "multipliers")
		arr := m.Array()
		if !m.IsArray() || len(arr) == 0 || len(arr) > MaxMultipliers {
			p.fail(mp, "must be an array of 1 to %d integers", MaxMultipliers)
			return pen
		}
		pen.Multipliers = make([]int64, len(arr))
		for i, e := range arr {
			pen.Multipliers[i] = p.integer(e, index(mp, i), 1, 1, MaxMultiplier)
			if e.Type != gjson.Number {
				p.fail(index(mp, i), "must be an integer")
			}
			if i > 0 && pen.Multipliers[i] < pen.Multipliers[i-1] {
				p.fail(index(mp, i), "must not be smaller than the one before: penalties only lengthen")
			}
		}
	}
	return pen
}
