package rules

// queryHolds reports whether fm holds for the query of path (what follows
// its first '?', up to a '#'): whether one of the parameters named
// fm.Name has a value (Present), or one's value is fm.Value. Names and
// values are compared decoded, as the application reads them ('+' is a
// space, %XX the byte), so that an encoding of the same text does not
// escape a limit; and any parameter of that name counts, not only the
// first, so that a client cannot hide the one a limit looks for behind
// another of the same name. A '%' not followed by two hex digits is
// itself. It allocates nothing.
func queryHolds(path string, fm *FieldMatch) bool {
	q := ""
	for i := 0; i < len(path); i++ {
		if path[i] == '#' {
			return false
		}
		if path[i] == '?' {
			q = path[i+1:]
			break
		}
	}
	for q != "" {
		pair := q
		q = ""
		for i := 0; i < len(pair); i++ {
			if pair[i] == '&' || pair[i] == '#' {
				if pair[i] == '&' {
					q = pair[i+1:]
				}
				pair = pair[:i]
				break
			}
		}
		name, value := pair, ""
		for i := 0; i < len(pair); i++ {
			if pair[i] == '=' {
				name, value = pair[:i], pair[i+1:]
				break
			}
		}
		if !unescapedEqual(name, fm.Name) {
			continue
		}
		if fm.Present {
			if value != "" { // one byte or more decodes to one or more
				return true
			}
		} else if unescapedEqual(value, fm.Value) {
			return true
		}
	}
	return false
}

// unescapedEqual reports whether raw, a query's name or value, decodes to
// want.
func unescapedEqual(raw, want string) bool {
	j := 0
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case c == '+':
			c = ' '
		case c == '%' && i+2 < len(raw):
			if hi, lo := unhex(raw[i+1]), unhex(raw[i+2]); hi >= 0 && lo >= 0 {
				c = byte(hi<<4 | lo)
				i += 2
			}
		}
		if j == len(want) || want[j] != c {
			return false
		}
		j++
	}
	return j == len(want)
}
