package tests

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/fabric-mls/fabric/internal/eventually"
)

// natsUsers are the users of deploy/nats/accounts.conf; each password is
// read from FABRIC_<USER>_PASSWORD.
var natsUsers = []string{"ingest", "converge", "fanout", "api", "admin", "sys"}

// routeIdentity is the URI the cluster's route authorization maps a route's
// certificate to (deploy/nats/nats-*.conf, cluster.authorization.user).
const routeIdentity = "spiffe://fabric/nats-route"

// deployTLS writes a CA and one server certificate for every NATS node of
// every deploy (ca.crt, server.crt, server.key, as deploy/README.md names
// them) into dir, and other.crt, the same key certified without the route
// identity. The server certificate also authenticates routes: it
// names routeIdentity and may be used as a client certificate.
func deployTLS(t testing.TB, dir string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "fabric test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ = x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	route, _ := url.Parse(routeIdentity)
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "fabric-nats"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames: []string{"localhost", "nats-1", "nats-2", "nats-3", "fabric-nats",
			"fabric-nats-0.fabric-nats", "fabric-nats-1.fabric-nats", "fabric-nats-2.fabric-nats"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		URIs:        []*url.URL{route},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	// A certificate of the same CA without the route identity, which a
	// node must not accept as a route.
	other := *leaf
	other.SerialNumber, other.URIs = big.NewInt(3), nil
	otherDER, err := x509.CreateCertificate(rand.Reader, &other, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	for name, block := range map[string]*pem.Block{
		"ca.crt":     {Type: "CERTIFICATE", Bytes: caDER},
		"server.crt": {Type: "CERTIFICATE", Bytes: leafDER},
		"server.key": {Type: "PRIVATE KEY", Bytes: keyDER},
		"other.crt":  {Type: "CERTIFICATE", Bytes: otherDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// natsNode is one node of the deploy's cluster made into a test's:
// loopback ports and folders in the test's temporary folder.
type natsNode struct {
	conf          string // the rewritten configuration file
	client, route int    // ports
	monitor       int
	srv           *server.Server
}

// deployCluster is deploy/nats run on loopback.
type deployCluster struct {
	dir       string
	nodes     []*natsNode
	passwords map[string]string // by user
	logs      *violationLog
}

// rewrite replaces old by new in conf and fails unless old occurs want
// times: the test changes ports and paths and nothing else.
func rewrite(t testing.TB, file, conf, old, new string, want int) string {
	t.Helper()
	if n := strings.Count(conf, old); n != want {
		t.Fatalf("%s: %q occurs %d times, the test expects %d", file, old, n, want)
	}
	return strings.ReplaceAll(conf, old, new)
}

// loopbackPorts returns n ports free on loopback right now.
func loopbackPorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		_, p, _ := net.SplitHostPort(freeAddr(t))
		var port int
		fmt.Sscan(p, &port)
		ports = append(ports, port)
	}
	return ports
}

// writeDeployNATS copies deploy/nats into dir with every node's ports
// rewritten to free loopback ports and its store and TLS folders to dir;
// with a domain, each node's JetStream gets that domain. It sets the users'
// passwords in the environment, as compose and Kubernetes do.
func writeDeployNATS(t *testing.T, dir, domain string) *deployCluster {
	t.Helper()
	c := &deployCluster{dir: dir, passwords: map[string]string{}}
	for _, u := range natsUsers {
		b := make([]byte, 16)
		rand.Read(b)
		c.passwords[u] = hex.EncodeToString(b)
		t.Setenv("FABRIC_"+strings.ToUpper(u)+"_PASSWORD", c.passwords[u])
	}
	tlsDir := filepath.Join(dir, "tls")
	if err := os.MkdirAll(tlsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	deployTLS(t, tlsDir)
	ports := loopbackPorts(t, 9)
	for i := range 3 {
		c.nodes = append(c.nodes, &natsNode{client: ports[3*i], route: ports[3*i+1], monitor: ports[3*i+2]})
	}
	accounts := readDeployFile(t, "deploy/nats/accounts.conf")
	for i, n := range c.nodes {
		file := fmt.Sprintf("deploy/nats/nats-%d.conf", i+1)
		conf := string(readDeployFile(t, file))
		conf = rewrite(t, file, conf, "listen: 0.0.0.0:4222", fmt.Sprintf("listen: 127.0.0.1:%d", n.client), 1)
		conf = rewrite(t, file, conf, "http: 127.0.0.1:8222", fmt.Sprintf("http: 127.0.0.1:%d", n.monitor), 1)
		conf = rewrite(t, file, conf, "listen: 0.0.0.0:6222", fmt.Sprintf("listen: 127.0.0.1:%d", n.route), 1)
		for j, m := range c.nodes {
			conf = rewrite(t, file, conf, fmt.Sprintf("nats-route://nats-%d:6222", j+1), fmt.Sprintf("nats-route://127.0.0.1:%d", m.route), 1)
		}
		nodeDir := filepath.Join(dir, fmt.Sprintf("nats-%d", i+1))
		conf = rewrite(t, file, conf, "store_dir: /data/jetstream", "store_dir: "+filepath.Join(nodeDir, "jetstream"), 1)
		conf = rewrite(t, file, conf, "/etc/nats/tls/", tlsDir+"/", 6)
		if domain != "" {
			conf = rewrite(t, file, conf, "jetstream {\n", "jetstream {\n  domain: "+domain+"\n", 1)
		}
		if err := os.MkdirAll(nodeDir, 0o700); err != nil {
			t.Fatal(err)
		}
		n.conf = filepath.Join(nodeDir, "nats.conf")
		if err := os.WriteFile(n.conf, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(nodeDir, "accounts.conf"), accounts, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// violationLog keeps the servers' log lines, so a failed test shows the
// permission violations behind it.
type violationLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *violationLog) add(format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, v...))
}

// contains reports whether one line holds every part.
func (l *violationLog) contains(parts ...string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}

func (l *violationLog) Noticef(format string, v ...any) {}
func (l *violationLog) Warnf(format string, v ...any)   { l.add(format, v...) }
func (l *violationLog) Fatalf(format string, v ...any)  { l.add(format, v...) }
func (l *violationLog) Errorf(format string, v ...any)  { l.add(format, v...) }
func (l *violationLog) Debugf(format string, v ...any)  {}
func (l *violationLog) Tracef(format string, v ...any)  {}

// startNode loads node i's configuration the way nats-server does and
// starts it in this process.
func (c *deployCluster) startNode(t *testing.T, i int) {
	t.Helper()
	n := c.nodes[i]
	opts, err := server.ProcessConfigFile(n.conf)
	if err != nil {
		t.Fatalf("%s: %v", n.conf, err)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("%s: %v", n.conf, err)
	}
	s.SetLoggerV2(c.logs, false, false, false)
	s.Start()
	n.srv = s
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(30 * time.Second) {
		t.Fatalf("NATS node %d did not start", i+1)
	}
}

// start runs every node and waits until the cluster's routes are up.
func (c *deployCluster) start(t *testing.T) {
	t.Helper()
	c.logs = &violationLog{}
	t.Cleanup(func() {
		if t.Failed() {
			c.logs.mu.Lock()
			t.Logf("NATS servers' warnings and errors:\n%s", strings.Join(c.logs.lines, "\n"))
			c.logs.mu.Unlock()
		}
	})
	for i := range c.nodes {
		c.startNode(t, i)
	}
	eventually.Within(t, 30*time.Second, "the three NATS nodes route to each other", func() bool {
		for _, n := range c.nodes {
			if n.srv.NumRoutes() < 2 {
				return false
			}
		}
		return true
	})
}

// url is the roles' -nats-url: compose's with its host names made the
// nodes' loopback addresses.
func (c *deployCluster) url(t *testing.T, composeURL string) string {
	t.Helper()
	u := composeURL
	for i, n := range c.nodes {
		u = rewrite(t, composeFile, u, fmt.Sprintf("nats-%d:4222", i+1), fmt.Sprintf("127.0.0.1:%d", n.client), 1)
	}
	return u
}
