package natstest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fabric-mls/fabric/internal/natsserver"
)

// childEnv names the store folder of a test binary started as a server's
// process by InChildProcess.
const childEnv = "FABRIC_NATSTEST_SERVER_DIR"

// InChildProcess runs the server in a process of its own, as deployments
// run nats-server: the test binary started again, serving a server with the
// same options as the embedded one. With cpus not empty the process runs
// under `taskset -c cpus`, so a benchmark pinned to other cores holds none
// of the server's CPU or memory. The test binary's TestMain must call
// ServeChild first. Env.Server is nil; Env.Process is the server's.
func InChildProcess(cpus string) Option {
	return func(o *options) { o.child, o.cpus = true, cpus }
}

// ServeChild makes the process the server of a parent's InChildProcess and
// never returns: it prints the client URL, serves until its standard input
// closes, and exits. In any other process it returns at once.
func ServeChild() {
	dir := os.Getenv(childEnv)
	if dir == "" {
		return
	}
	s, err := natsserver.Start(context.Background(), natsserver.Options{StoreDir: dir, Port: natsserver.RandomPort})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(s.ClientURL())
	_, _ = io.Copy(io.Discard, os.Stdin)
	s.Shutdown()
	os.Exit(0)
}

// startChild starts the test binary as a server's process and returns its
// client URL; the process stops when the test ends.
func startChild(t testing.TB, cpus string) (*os.Process, string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{self}
	if cpus != "" {
		args = append([]string{"taskset", "-c", cpus}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), childEnv+"="+t.TempDir())
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the server's process: %v", err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		stop := time.AfterFunc(30*time.Second, func() { _ = cmd.Process.Kill() })
		defer stop.Stop()
		_ = cmd.Wait()
	})
	// A server that never comes up is killed, which ends the read.
	kill := time.AfterFunc(30*time.Second, func() { _ = cmd.Process.Kill() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	kill.Stop()
	if err != nil {
		t.Fatalf("the server's process gave no URL: %v", err)
	}
	return cmd.Process, strings.TrimSpace(line)
}
