package policy

import (
	"context"
	"embed"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The schema is versioned: migrations/NNNN_name.sql, applied in order, each
// recorded in sluice_schema_migrations. Bridges apply what is missing when
// they start, all of it in one transaction under an advisory lock, so
// bridges starting together apply each migration once, and a bridge that
// fails half way leaves the schema as it was.

//go:embed migrations/*.sql
var migrationFiles embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

// migrations lists the embedded migrations by version.
func migrations() []migration {
	ents, err := migrationFiles.ReadDir("migrations")
	if err != nil {
		panic(err) // embedded at build time
	}
	var out []migration
	for _, e := range ents {
		num, name, ok := strings.Cut(strings.TrimSuffix(e.Name(), ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			panic("policy: migration file " + e.Name() + " is not NNNN_name.sql")
		}
		b, err := migrationFiles.ReadFile("migrations/" + e.Name())
		if err != nil {
			panic(err)
		}
		out = append(out, migration{v, name, string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i, m := range out {
		if m.version != i+1 {
			panic(fmt.Sprintf("policy: migrations must be numbered 1, 2, ...; found %d at %d", m.version, i+1))
		}
	}
	return out
}

// SchemaVersion is the schema version this bridge migrates to.
func SchemaVersion() int { return len(migrations()) }

// migrationLock is the key of the advisory lock migrations run under
// ("sluice" in ASCII), held until their transaction ends.
const migrationLock = 0x736c75696365

// migrate brings the schema to version to (all: SchemaVersion()) and
// returns the version it found and the one it left. A database whose
// schema is newer than this bridge's is left alone.
func migrate(ctx context.Context, conn *pgx.Conn, to int) (from, now int, err error) {
	all := migrations()
	if to <= 0 || to > len(all) {
		to = len(all)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", int64(migrationLock)); err != nil {
		return 0, 0, err
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS sluice_schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return 0, 0, err
	}
	if err := tx.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM sluice_schema_migrations").Scan(&from); err != nil {
		return 0, 0, err
	}
	now = from
	for _, m := range all {
		if m.version <= from || m.version > to {
			continue
		}
		if _, err := tx.Exec(ctx, m.sql); err != nil {
			return from, from, fmt.Errorf("migration %d (%s): %w", m.version, m.name, err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO sluice_schema_migrations (version, name) VALUES ($1, $2)", m.version, m.name); err != nil {
			return from, from, err
		}
		now = m.version
	}
	if err := tx.Commit(ctx); err != nil {
		return from, from, err
	}
	return from, now, nil
}
