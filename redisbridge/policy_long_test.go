//go:build long

package redisbridge

import "testing"

// TestLong_PostgresKilledUnderLoad kills and restarts PostgreSQL ten
// times under checks and changes.
func TestLong_PostgresKilledUnderLoad(t *testing.T) { postgresKilledUnderLoad(t, 10) }
