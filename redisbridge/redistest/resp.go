package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// Do sends one command to the Redis (or sentinel) at addr and returns its
// reply: a string for simple, bulk and integer replies, []any for arrays,
// nil for a null reply. A Redis error reply is returned as an error. It
// opens a connection per call: for test set-up and probes, not for load.
func Do(addr string, timeout time.Duration, args ...string) (any, error) {
	replies, err := DoAll(addr, timeout, args)
	if err != nil {
		return nil, err
	}
	return replies[0], nil
}

// DoAll sends commands one after another on one connection and returns
// their replies, as Do does, stopping at the first error. Commands whose
// effect depends on the connection need it: WAIT waits for the writes of
// its own connection only, and on a new one returns at once.
func DoAll(addr string, timeout time.Duration, cmds ...[]string) ([]any, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	r := bufio.NewReader(c)
	replies := make([]any, 0, len(cmds))
	for _, args := range cmds {
		var b strings.Builder
		fmt.Fprintf(&b, "*%d\r\n", len(args))
		for _, a := range args {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
		}
		if _, err := c.Write([]byte(b.String())); err != nil {
			return replies, err
		}
		v, err := readReply(r)
		if err != nil {
			return replies, fmt.Errorf("%s: %w", args[0], err)
		}
		replies = append(replies, v)
	}
	return replies, nil
}

// DoString is Do for commands with a string (or integer) reply.
func DoString(addr string, timeout time.Duration, args ...string) (string, error) {
	v, err := Do(addr, timeout, args...)
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%s: reply %T, want a string", args[0], v)
	}
	return s, nil
}

func readReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("empty reply line")
	}
	body := line[1:]
	switch line[0] {
	case '+', ':':
		return body, nil
	case '-':
		return nil, errors.New(body)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil {
			return nil, fmt.Errorf("bulk length %q", body)
		}
		if n < 0 {
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil {
			return nil, fmt.Errorf("array length %q", body)
		}
		if n < 0 {
			return nil, nil
		}
		out := make([]any, n)
		for i := range out {
			if out[i], err = readReply(r); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("unknown reply %q", line)
}

// CommandStats reads INFO commandstats of the Redis at addr: calls per
// command (lower case, subcommands as "config|resetstat"), and the
// microseconds spent in each under "<name>.usec". A script's own
// commands are counted too.
func CommandStats(addr string) (map[string]int64, error) {
	info, err := DoString(addr, 5*time.Second, "INFO", "commandstats")
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		name = strings.TrimPrefix(name, "cmdstat_")
		f := strings.Split(rest, ",")
		n, _ := strconv.ParseInt(f[0], 10, 64)
		out[name] = n
		if len(f) > 1 {
			usec, _ := strconv.ParseInt(strings.TrimPrefix(f[1], "usec="), 10, 64)
			out[name+".usec"] = usec
		}
	}
	return out, nil
}
