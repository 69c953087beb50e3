package ops

import (
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of Limits.
const (
	// DefaultIdleTimeout closes a keep-alive connection idle between
	// requests; a connection that never sends a request is closed by the
	// read header timeout.
	DefaultIdleTimeout       = 60 * time.Second
	DefaultReadHeaderTimeout = 10 * time.Second
	// DefaultMaxConnsPerAddr bounds the connections one remote address
	// holds.
	DefaultMaxConnsPerAddr = 1024
	// MinFileReserve is the least number of descriptors kept out of the
	// HTTP connection bound for NATS, JetStream's files and the process
	// itself: a full descriptor table makes JetStream refuse every later
	// write until restarted.
	MinFileReserve = 256
)

// Limits bound the connections a role's HTTP server holds. A zero field
// takes its default.
type Limits struct {
	// MaxConns bounds the open HTTP connections, WebSockets included. Zero
	// derives it from the descriptor limit less FileReserve; negative
	// removes the bound.
	MaxConns int
	// MaxConnsPerAddr bounds the connections of one remote IP address;
	// negative removes the bound.
	MaxConnsPerAddr int
	// FileReserve is how many descriptors MaxConns leaves to everything
	// else; the larger of MinFileReserve and a quarter of the limit when
	// zero.
	FileReserve int
	// IdleTimeout and ReadHeaderTimeout are the http.Server's.
	IdleTimeout       time.Duration
	ReadHeaderTimeout time.Duration
}

func (l Limits) withDefaults() Limits {
	if l.MaxConns == 0 {
		n := FileLimit()
		reserve := l.FileReserve
		if reserve <= 0 {
			reserve = max(MinFileReserve, n/4)
		}
		l.MaxConns = max(1, n-reserve)
	}
	if l.MaxConnsPerAddr == 0 {
		l.MaxConnsPerAddr = DefaultMaxConnsPerAddr
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	if l.ReadHeaderTimeout <= 0 {
		l.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	return l
}

// RaiseFileLimit raises the process's open-file soft limit to its hard
// limit and returns the new soft limit.
func RaiseFileLimit() (int, error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, err
	}
	if r.Cur < r.Max {
		r.Cur = r.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
			return 0, err
		}
	}
	return clampInt(r.Cur), nil
}

// FileLimit is the process's open-file soft limit.
func FileLimit() int {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 1024
	}
	return clampInt(r.Cur)
}

func clampInt(v uint64) int {
	const maxInt = int(^uint(0) >> 1)
	if v > uint64(maxInt) {
		return maxInt
	}
	return int(v)
}

// limitListener closes, at once, a connection past the total or its
// address's bound, so that descriptors stay for the rest of the process.
type limitListener struct {
	net.Listener
	max, perAddr int
	refused      *prometheus.CounterVec

	mu     sync.Mutex
	open   int
	byAddr map[string]int
}

func newLimitListener(ln net.Listener, l Limits, refused *prometheus.CounterVec) *limitListener {
	return &limitListener{Listener: ln, max: l.MaxConns, perAddr: l.MaxConnsPerAddr, refused: refused, byAddr: map[string]int{}}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if reason := l.admit(c); reason != "" {
			l.refused.WithLabelValues(reason).Inc()
			_ = c.Close()
			continue
		}
		return &limitedConn{Conn: c, l: l, addr: addrKey(c)}, nil
	}
}

// admit counts c in, or says why it is refused.
func (l *limitListener) admit(c net.Conn) string {
	addr := addrKey(c)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.max > 0 && l.open >= l.max:
		return "total"
	case l.perAddr > 0 && l.byAddr[addr] >= l.perAddr:
		return "per_address"
	}
	l.open++
	l.byAddr[addr]++
	return ""
}

func (l *limitListener) release(addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if l.byAddr[addr]--; l.byAddr[addr] <= 0 {
		delete(l.byAddr, addr)
	}
}

func addrKey(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return c.RemoteAddr().String()
}

type limitedConn struct {
	net.Conn
	l    *limitListener
	addr string
	once sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.addr) })
	return err
}
