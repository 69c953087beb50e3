package config

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestEnvSetsDefaults(t *testing.T) {
	t.Setenv("FABRIC_NATS_URL", "nats://127.0.0.1:4333")
	t.Setenv("FABRIC_DRAIN_TIMEOUT", "7s")
	var (
		errs  Errs
		n     NATS
		drain time.Duration
	)
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	n.RegisterFlags(fs, &errs)
	Duration(fs, &errs, &drain, "drain-timeout", time.Second, "")
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	n.Validate(&errs)
	if err := errs.Err(); err != nil {
		t.Fatal(err)
	}
	if n.URL != "nats://127.0.0.1:4333" || drain != 7*time.Second {
		t.Fatalf("url %q drain %v", n.URL, drain)
	}
}

func TestValidateNamesEveryProblem(t *testing.T) {
	t.Setenv("FABRIC_DRAIN_TIMEOUT", "soon")
	t.Setenv("FABRIC_NATS_PASSWORD", "")
	var (
		errs  Errs
		n     NATS
		drain time.Duration
	)
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	n.RegisterFlags(fs, &errs)
	Duration(fs, &errs, &drain, "drain-timeout", time.Second, "")
	if err := fs.Parse([]string{"-nats-url=http//nope", "-replicas=2", "-nats-user=ingest"}); err != nil {
		t.Fatal(err)
	}
	n.Validate(&errs)
	ValidateListen(&errs, "8080")
	MasterKey(&errs, "")
	err := errs.Err()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"FABRIC_DRAIN_TIMEOUT", "-nats-url", "-replicas", "FABRIC_NATS_PASSWORD", "-listen", "FABRIC_MASTER_KEY"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %s:\n%v", want, err)
		}
	}
}

func TestMasterKeyFromFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(path, []byte(strings.Repeat("ab", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var errs Errs
	if key := MasterKey(&errs, path); len(key) != 32 || errs.Err() != nil {
		t.Fatalf("key %x errs %v", key, errs.Err())
	}
	var bad Errs
	os.WriteFile(path, []byte("xyz"), 0o600)
	if MasterKey(&bad, path) != nil || bad.Err() == nil {
		t.Fatal("bad key accepted")
	}
}

// TestNATSURLWithCredentialsIsRefused keeps the NATS password out of flag
// values, where a process listing shows it, and out of the error.
func TestNATSURLWithCredentialsIsRefused(t *testing.T) {
	var errs Errs
	n := NATS{URL: "tls://nats-1:4222,nats://ingest:hunter2@nats-2:4222", Replicas: 3}
	n.Validate(&errs)
	err := errs.Err()
	if err == nil || !strings.Contains(err.Error(), "carries credentials") {
		t.Fatalf("a URL with a password was accepted: %v", err)
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Errorf("the error shows the password: %v", err)
	}
}
