package redisbridge

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/redisbridge/redistest"
)

// TestSecurity_RedisNoAuthIsUnavailable: a bridge without credentials in
// its URL, against a Redis whose default user is off (as in production
// with ACL users), answers checks 503 SERVICE_UNAVAILABLE, as /readyz
// does, so the plugin applies its failure mode. (It once answered 500:
// Redis's reply to an unauthenticated script call was taken for a bug.)
func TestSecurity_RedisNoAuthIsUnavailable(t *testing.T) {
	rs := redistest.Start(t)
	if _, err := redistest.Do(rs.Addr, 2*time.Second, "ACL", "SETUSER", "default", "off"); err != nil {
		t.Fatal(err)
	}
	expectStore(t, rs.URL, 503)
}
