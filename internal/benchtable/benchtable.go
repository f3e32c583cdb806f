// Package benchtable is the one table `make bench` prints: benchmarks in
// any package append rows (figures measured in the same run) to a file of
// JSON lines, and cmd/benchtable prints them, group by group, each figure
// with its ratio to the group's base row.
package benchtable

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Env names the file rows are appended to; benchmarks append nothing when
// it is unset.
const Env = "SLUICE_BENCH_TABLE"

// Row is one line of the table.
type Row struct {
	Group string // the table a row belongs to, with what the rows share
	Name  string // what was measured
	Base  bool   // the row the others of its group are compared to
	// Metrics are the figures in the order of the columns; a row may
	// leave one out.
	Metrics []Metric
	Note    string `json:",omitempty"`
}

// Metric is one figure of a row.
type Metric struct {
	Name  string // column title, with its unit
	Value float64
	// Ratio prints value/base beside it when the group's base row has
	// the metric.
	Ratio bool `json:",omitempty"`
}

// Append adds rows to the file named by $SLUICE_BENCH_TABLE, if set.
func Append(rows ...Row) error {
	path := os.Getenv(Env)
	if path == "" {
		return nil
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("benchtable: %w", err)
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	for _, r := range rows {
		if err := enc.Encode(r); err != nil {
			return fmt.Errorf("benchtable: %w", err)
		}
	}
	return nil
}

// Median is the median of f over runs, the upper one of an even count:
// the figure a table reports for runs repeated to let a machine's drift
// and noise show.
func Median[R any](runs []R, f func(R) float64) float64 {
	if len(runs) == 0 {
		return 0
	}
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = f(r)
	}
	slices.Sort(v)
	return v[len(v)/2]
}

// Read reads the rows of a file Append wrote.
func Read(r io.Reader) ([]Row, error) {
	var rows []Row
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var row Row
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil {
			return nil, fmt.Errorf("benchtable: line %d: %w", n, err)
		}
		rows = append(rows, row)
	}
	return rows, sc.Err()
}

// Print writes rows as Markdown tables, one per group in the order the
// groups first appear. A figure of a row other than the base is followed
// by its ratio to the base row's, where asked for.
func Print(w io.Writer, rows []Row) {
	var groups []string
	byGroup := map[string][]Row{}
	for _, r := range rows {
		if _, ok := byGroup[r.Group]; !ok {
			groups = append(groups, r.Group)
		}
		byGroup[r.Group] = append(byGroup[r.Group], r)
	}
	for gi, g := range groups {
		rs := byGroup[g]
		var cols []string
		seen := map[string]bool{}
		base := map[string]float64{}
		for _, r := range rs {
			for _, m := range r.Metrics {
				if !seen[m.Name] {
					seen[m.Name] = true
					cols = append(cols, m.Name)
				}
				if r.Base {
					base[m.Name] = m.Value
				}
			}
		}
		if gi > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s\n\n| |", g)
		for _, c := range cols {
			fmt.Fprintf(w, " %s |", c)
		}
		fmt.Fprint(w, "\n| --- |")
		for range cols {
			fmt.Fprint(w, " --- |")
		}
		fmt.Fprintln(w)
		var notes []string
		for _, r := range rs {
			name := r.Name
			if r.Note != "" {
				notes = append(notes, r.Note)
				name += fmt.Sprintf(" [%d]", len(notes))
			}
			fmt.Fprintf(w, "| %s |", name)
			for _, c := range cols {
				cell := ""
				for _, m := range r.Metrics {
					if m.Name != c {
						continue
					}
					cell = format(m.Value)
					if b, ok := base[c]; ok && m.Ratio && !r.Base && b != 0 {
						cell += fmt.Sprintf(" (%.2f×)", m.Value/b)
					}
				}
				fmt.Fprintf(w, " %s |", cell)
			}
			fmt.Fprintln(w)
		}
		for i, n := range notes {
			fmt.Fprintf(w, "\n[%d] %s", i+1, n)
		}
		if len(notes) > 0 {
			fmt.Fprintln(w)
		}
	}
}

// format prints a figure with 3 significant digits, thousands grouped.
func format(v float64) string {
	switch {
	case v >= 1000:
		s := strconv.FormatFloat(v, 'f', 0, 64)
		var b strings.Builder
		for i, c := range s {
			if i > 0 && (len(s)-i)%3 == 0 {
				b.WriteByte(',')
			}
			b.WriteRune(c)
		}
		return b.String()
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case v >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}
