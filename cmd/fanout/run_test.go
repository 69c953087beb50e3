package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/natsserver/natstest"
	"github.com/fabric-mls/fabric/pkg/client"
	"github.com/fabric-mls/fabric/pkg/schema"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The role starts against NATS, serves subscriptions, and on SIGTERM ends
// them with reason shutdown and returns.
func TestRunServesAndDrainsOnSIGTERM(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The role provisions its streams itself.
	env := natstest.Start(t, natstest.OverLoopback(), natstest.WithoutStreams())
	ns := env.Server
	secret := strings.Repeat("k", 40)
	t.Setenv("FABRIC_JWT_SECRET", secret)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	done := make(chan error, 1)
	go func() {
		done <- run([]string{"-nats-url", ns.ClientURL(), "-listen", addr, "-drain-timeout", "5s"},
			slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		select {
		case err := <-done:
			t.Fatalf("run ended: %v", err)
		case <-ctx.Done():
			t.Fatal("never ready")
		case <-time.After(20 * time.Millisecond):
		}
	}
	// The gateway serves hosted clients only: c1 gets a record, put as a
	// publish on the bucket's subject.
	if _, err := env.Conn.Request("$KV."+streams.BucketClients+".t1.c1", []byte{0x80}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	tok, err := auth.Mint([]byte(secret), auth.Claims{Tenant: "t1", Scopes: []auth.Scope{auth.ScopeEvents},
		Clients: []string{"c1"}, ExpiresAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.Connect(ctx, "ws://"+addr+"/v1/events", tok, client.WithoutReconnect(),
		client.WithErrorHandler(func(error) {}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Subscribe(ctx, "c1", schema.EventFilter{Kinds: []schema.EventKind{schema.KindMessageReceived}})
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_, err = s.Next(ctx)
	var ee *client.EndedError
	if !errors.As(err, &ee) || ee.Reason != "shutdown" {
		t.Fatalf("subscription after SIGTERM: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}
