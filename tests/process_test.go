// Package tests holds the fabric's process-level tests: they build the
// binaries, run them as real processes on loopback, and talk to them the way
// an app and an operator do.
package tests

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// repoRoot is the module root, one folder up from this package.
func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// binaries builds every command once per test run and returns their folder.
func binaries(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "fabric-bin-")
		if buildErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", binDir+string(filepath.Separator), "./cmd/...")
		cmd.Dir = repoRoot(t)
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/...: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// parallelTests is how many tests run at once unless -test.parallel says:
// more than GOMAXPROCS, go test's default, because these tests mostly wait
// on processes and on timers (JetStream's idle file close, the outbound
// AckWait, convergence's settlement quiescence), not on this binary's CPU;
// those that run all-in-ones in this binary take turns (oneInProcess).
const parallelTests = 4

// TestMain sets parallelTests, and removes the built binaries after the run.
func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		if err := flag.Set("test.parallel", strconv.Itoa(parallelTests)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// freeAddr returns a loopback address with a port free right now.
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// process is a running binary whose stdout lines are collected.
type process struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
	added chan struct{}
	done  chan struct{}
}

// start runs bin with args and env (added to a clean environment), and stops
// it with SIGTERM when the test ends.
func start(t *testing.T, bin string, env []string, args ...string) *process {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logs := &strings.Builder{}
	var logMu sync.Mutex
	cmd.Stderr = writerFunc(func(b []byte) (int, error) {
		logMu.Lock()
		defer logMu.Unlock()
		return logs.Write(b)
	})
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, added: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
			select {
			case p.added <- struct{}{}:
			default:
			}
		}
		cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-p.done
			t.Errorf("%s did not drain within 20 s", filepath.Base(bin))
		}
		if t.Failed() {
			logMu.Lock()
			t.Logf("%s stderr:\n%s", filepath.Base(bin), logs.String())
			logMu.Unlock()
		}
	})
	return p
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// waitLine waits for a stdout line with prefix (after trimming spaces) and
// returns the rest of it.
func (p *process) waitLine(t *testing.T, prefix string, timeout time.Duration) string {
	t.Helper()
	return p.waitMatch(t, prefix, timeout, func(l string) (string, bool) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(l), prefix)
		return strings.TrimSpace(rest), ok
	})
}

// waitMatch waits for the first stdout line match accepts and returns what
// match made of it; what names the line in a failure.
func (p *process) waitMatch(t *testing.T, what string, timeout time.Duration, match func(string) (string, bool)) string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		p.mu.Lock()
		for _, l := range p.lines {
			if rest, ok := match(l); ok {
				p.mu.Unlock()
				return rest
			}
		}
		p.mu.Unlock()
		select {
		case <-p.added:
		case <-p.done:
			t.Fatalf("process exited before printing %q", what)
		case <-deadline:
			t.Fatalf("no line %q within %s", what, timeout)
		}
	}
}

// waitReady polls url until it answers 200.
func waitReady(t testing.TB, url string, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s not ready within %s (last error %v)", url, timeout, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func httpGet(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return b
}

// promtool runs promtool with args and stdin when it is installed, and
// skips otherwise (.ci/run installs it).
func promtool(t *testing.T, stdin []byte, args ...string) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed")
	}
	cmd := exec.Command(path, args...)
	if stdin != nil {
		cmd.Stdin = strings.NewReader(string(stdin))
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// runToExitWithin bounds a command's run. It bounds a hang, not a speed:
// `fabric load -cluster` (three NATS nodes and three role processes) takes
// 8 s on an idle machine and took over 30 s in a CI run beside the -race
// packages on two cores.
const runToExitWithin = 2 * time.Minute

// runToExit runs bin to its end (at most runToExitWithin) and returns its
// combined output and exit code.
func runToExit(t *testing.T, bin string, env []string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runToExitWithin)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}, env...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%s did not exit within %s:\n%s", filepath.Base(bin), runToExitWithin, out)
	}
	code := 0
	if err != nil {
		code = cmd.ProcessState.ExitCode()
	}
	return string(out), code
}
