package deploycheck

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

const dashboardPath = "../../deploy/grafana/sluice.json"

type gridPos struct{ H, W, X, Y int }

type panel struct {
	ID          int             `json:"id"`
	Type        string          `json:"type"`
	Title       string          `json:"title"`
	Description string          `json:"description"`
	GridPos     gridPos         `json:"gridPos"`
	Datasource  json.RawMessage `json:"datasource"`
	Targets     []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's panels
}

type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Definition string          `json:"definition"`
			Query      json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	return d
}

func (d dashboard) allPanels() []panel {
	var out []panel
	for _, p := range d.Panels {
		out = append(out, p)
		out = append(out, p.Panels...)
	}
	return out
}

// query is one PromQL expression of the dashboard and where it is.
type query struct{ where, expr string }

func (d dashboard) queries() []query {
	var out []query
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			out = append(out, query{fmt.Sprintf("panel %q (id %d) target %s", p.Title, p.ID, tg.RefID), tg.Expr})
		}
	}
	return out
}

// labelValues is Grafana's variable query label_values(selector, label):
// the selector is PromQL, the label one of its series' labels.
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)

// Every expression parses, and every metric, label and label value it
// names is served by the bridge or defined by the plugin.
func TestDashboard_Queries(t *testing.T) {
	c := metricCatalog(t)
	d := loadDashboard(t)
	qs := d.queries()
	if len(qs) == 0 {
		t.Fatal("no queries")
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(selector, label)", v.Name, v.Definition)
			continue
		}
		if !strings.Contains(string(v.Query), v.Definition) {
			t.Errorf("variable %s: query %s differs from its definition %q", v.Name, v.Query, v.Definition)
		}
		qs = append(qs, query{"variable " + v.Name, fmt.Sprintf("count by (%s) (%s)", m[2], m[1])})
	}
	for _, q := range qs {
		expr, err := expandGrafana(q.expr)
		if err != nil {
			t.Errorf("%s: %v\n  expr: %s", q.where, err, q.expr)
			continue
		}
		for _, p := range checkQuery(c, expr) {
			t.Errorf("%s: %s\n  expr: %s", q.where, p, q.expr)
		}
	}
}

// Every metric the plugin defines and every sluice_ metric the bridge
// serves is on the dashboard, so a new metric is charted or this fails.
func TestDashboard_ChartsEveryMetric(t *testing.T) {
	c := metricCatalog(t)
	used := map[string]bool{}
	for _, q := range loadDashboard(t).queries() {
		expr, err := expandGrafana(q.expr)
		if err != nil {
			continue // TestDashboard_Queries reports it
		}
		root, err := promql.ParseExpr(expr)
		if err != nil {
			continue
		}
		for _, vs := range selectorsUnder(root) {
			used[familyOf(selectorName(vs))] = true
		}
	}
	charted := map[string]bool{} // plugin metrics by the name defined
	for name := range used {
		if defined, ok := c.plugin[name]; ok {
			charted[defined] = true
		}
	}
	for name, defined := range c.plugin {
		if !charted[defined] {
			t.Errorf("plugin metric %s (defined as %s) is not charted in %s", name, defined, dashboardPath)
		}
	}
	for name := range c.bridge {
		if strings.HasPrefix(name, "sluice_") && !used[familyOf(name)] {
			t.Errorf("bridge metric %s is not charted in %s", name, dashboardPath)
		}
	}
}

// familyOf maps a histogram's series to one name, so charting any of them
// counts for the histogram.
func familyOf(series string) string {
	for _, s := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(series, s); ok && strings.HasSuffix(base, "_seconds") {
			return base
		}
	}
	return series
}

// The layout Grafana imports: unique panel ids, panels inside the 24-column
// grid and not overlapping, every query on the dashboard's data source
// variable, so the import asks which Prometheus to use.
func TestDashboard_Layout(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Error("dashboard needs a uid and a title")
	}
	hasDS := false
	for _, v := range d.Templating.List {
		hasDS = hasDS || v.Type == "datasource" && v.Name == "datasource"
	}
	if !hasDS {
		t.Error("no datasource variable named datasource")
	}
	ids := map[int]string{}
	var placed []panel
	for _, p := range d.allPanels() {
		if prev, dup := ids[p.ID]; dup || p.ID == 0 {
			t.Errorf("panel %q: id %d not unique (also %q)", p.Title, p.ID, prev)
		}
		ids[p.ID] = p.Title
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, g)
		}
		for _, q := range placed {
			o := q.GridPos
			if g.X < o.X+o.W && o.X < g.X+g.W && g.Y < o.Y+o.H && o.Y < g.Y+g.H {
				t.Errorf("panel %q overlaps %q", p.Title, q.Title)
			}
		}
		placed = append(placed, p)
		if p.Type == "row" {
			continue
		}
		if !strings.Contains(string(p.Datasource), "${datasource}") {
			t.Errorf("panel %q: datasource %s, want the ${datasource} variable", p.Title, p.Datasource)
		}
		if p.Description == "" {
			t.Errorf("panel %q: no description", p.Title)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("panel %q: refId %q empty or repeated", p.Title, tg.RefID)
			}
			refs[tg.RefID] = true
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q: no queries", p.Title)
		}
	}
}
