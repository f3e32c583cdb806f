package benchtable

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestPrint(t *testing.T) {
	rows := []Row{
		{Group: "g1", Name: "base", Base: true, Metrics: []Metric{{"decisions/s", 50000, true}, {"cpu µs", 10, true}}},
		{Group: "g1", Name: "fast", Metrics: []Metric{{"decisions/s", 60000, true}, {"cmds", 0.25, false}}, Note: "a note"},
		{Group: "g2", Name: "other", Metrics: []Metric{{"x", 1234567, true}}},
	}
	var b bytes.Buffer
	Print(&b, rows)
	want := `g1

| | decisions/s | cpu µs | cmds |
| --- | --- | --- | --- |
| base | 50,000 | 10.0 |  |
| fast [1] | 60,000 (1.20×) |  | 0.25 |

[1] a note

g2

| | x |
| --- | --- |
| other | 1,234,567 |
`
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
}

func TestAppendRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.jsonl")
	t.Setenv(Env, path)
	in := []Row{{Group: "g", Name: "a", Base: true, Metrics: []Metric{{"m", 1.5, true}}}, {Group: "g", Name: "b"}}
	if err := Append(in[0]); err != nil {
		t.Fatal(err)
	}
	if err := Append(in[1]); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out, err := Read(f)
	if err != nil || len(out) != 2 || out[0].Name != "a" || out[0].Metrics[0].Value != 1.5 || !out[0].Base || out[1].Name != "b" {
		t.Fatalf("%+v %v", out, err)
	}
}

func TestMedian(t *testing.T) {
	id := func(v float64) float64 { return v }
	for _, c := range []struct {
		runs []float64
		want float64
	}{
		{nil, 0},
		{[]float64{7}, 7},
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 3},
		{[]float64{5, -1, 9, 9, 0}, 5},
	} {
		if got := Median(c.runs, id); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.runs, got, c.want)
		}
	}
}
