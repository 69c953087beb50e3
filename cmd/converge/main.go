// Command converge is the converge role: it owns input partitions of
// FABRIC_IN, processes each group's input in order for every hosted member,
// and commits the per-client events behind each group's checkpoint fence.
//
// Configuration is by flags, each with a FABRIC_ environment variable:
//
//	-nats-url          NATS server URLs (FABRIC_NATS_URL)
//	-worker-id         this worker's lease name; host name and pid by default
//	-listen            address of /metrics, /healthz and /readyz
//	-partitions        partitions it may own: "all", or a list like "0-15,32"
//	-lease-ttl         partition lease lifetime
//	-cleanup-interval  disappearing-messages cleanup period
//	-snapshot-every    transactions between member state writes (default 1)
//	-idle-after        how long an idle group's members stay in memory (default 1m)
//	-message-retention how long a message stays readable (default 0: until deleted, expired or invalidated)
//	-max-batch         the NATS servers' atomic batch limit in messages (default 1000)
//	-key-package-pool  KeyPackages a hosted client holds again after a join consumed one (default 1)
//	-self-update-after leaf age after which a hosted member self-updates (default 0: off)
//	-master-key-file   file with the master key; else FABRIC_MASTER_KEY
//
// The master key (64 hex digits) opens the sealed installations and member
// states; like every secret it is read from the environment or a file, never
// from a flag value. SIGTERM or SIGINT drains: partitions stop after their
// current input and their leases are released for another worker.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/clientstore"
	"github.com/fabric-mls/fabric/internal/config"
	"github.com/fabric-mls/fabric/internal/converge"
	"github.com/fabric-mls/fabric/internal/engine"
	"github.com/fabric-mls/fabric/internal/ops"
)

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	slog.SetDefault(log)
	err := run(os.Args[1:], log)
	if errors.Is(err, config.ErrReported) {
		os.Exit(2)
	}
	if err != nil {
		log.Error("converge stopped", "err", err)
		os.Exit(1)
	}
}

type options struct {
	nats            config.NATS
	workerID        string
	listen          string
	partitions      string
	leaseTTL        time.Duration
	cleanupInterval time.Duration
	snapshotEvery   int
	idleAfter       time.Duration
	retention       time.Duration
	maxBatch        int
	keyPackagePool  int
	selfUpdate      time.Duration
	masterKeyFile   string
}

func parse(args []string) (options, []byte, error) {
	var o options
	var errs config.Errs
	fs := flag.NewFlagSet("converge", flag.ContinueOnError)
	o.nats.RegisterFlags(fs, &errs)
	host, _ := os.Hostname()
	config.String(fs, &o.workerID, "worker-id", sanitize(host)+"-"+strconv.Itoa(os.Getpid()), "worker id in partition leases ([A-Za-z0-9_-], unique per worker)")
	config.Listen(fs, &o.listen, ":8082")
	config.String(fs, &o.partitions, "partitions", "all", `input partitions this worker may own: "all" or a list like "0-15,32"`)
	config.Duration(fs, &errs, &o.leaseTTL, "lease-ttl", converge.DefaultLeaseTTL, "partition lease lifetime; a dead worker's partitions move within about 4/3 of it")
	config.Duration(fs, &errs, &o.cleanupInterval, "cleanup-interval", converge.DefaultCleanupInterval, "period of the disappearing-messages cleanup pass")
	config.Duration(fs, &errs, &o.retention, "message-retention", 0, "how long a message stays readable through the read API (0: until deleted, expired or invalidated)")
	config.Int(fs, &errs, &o.snapshotEvery, "snapshot-every", 1, "transactions a member state may advance before it is written again (1 keeps no used message key at rest)")
	config.Duration(fs, &errs, &o.idleAfter, "idle-after", converge.DefaultIdleAfter, "how long a group's hosted members stay in memory after its last transaction; its next input restores them from their stored state")
	config.Int(fs, &errs, &o.maxBatch, "max-batch", bus.DefaultMaxBatch, "atomic batch limit of the NATS servers in messages (jetstream.limits.batch.max_msgs); a transaction's events and checkpoint fit one batch")
	config.Int(fs, &errs, &o.keyPackagePool, "key-package-pool", clientstore.DefaultKeyPackagePool, "unconsumed KeyPackages a hosted client holds again after a join consumed one: fresh ones refill its pool")
	config.Duration(fs, &errs, &o.selfUpdate, "self-update-after", 0, "age of a hosted member's leaf after which converge commits a self-update for it, for post-compromise security (0: off; at least 1m)")
	config.String(fs, &o.masterKeyFile, "master-key-file", "", "file holding the master key as 64 hex digits (else FABRIC_MASTER_KEY)")
	if err := config.Parse(fs, args); err != nil {
		return o, nil, err
	}
	o.nats.Validate(&errs)
	config.ValidateListen(&errs, o.listen)
	if o.snapshotEvery < 1 {
		errs.Addf("-snapshot-every: %d; use 1 or more", o.snapshotEvery)
	}
	if o.idleAfter <= 0 {
		errs.Addf("-idle-after: %v; use more than 0", o.idleAfter)
	}
	if o.retention < 0 || o.retention%time.Second != 0 {
		errs.Addf("-message-retention: %v; use 0 or whole seconds", o.retention)
	}
	if o.maxBatch < 2 {
		errs.Addf("-max-batch: %d; use 2 or more (events and a checkpoint)", o.maxBatch)
	}
	if o.keyPackagePool < 1 || o.keyPackagePool > clientstore.MaxKeyPackages {
		errs.Addf("-key-package-pool: %d; use 1 to %d", o.keyPackagePool, clientstore.MaxKeyPackages)
	}
	if o.selfUpdate != 0 && o.selfUpdate < time.Minute {
		errs.Addf("-self-update-after: %v; use 0 (off) or 1m or more", o.selfUpdate)
	}
	if _, err := parsePartitions(o.partitions); err != nil {
		errs.Addf("-partitions: %v", err)
	}
	key := config.MasterKey(&errs, o.masterKeyFile)
	return o, key, errs.Err()
}

// sanitize keeps the characters a worker id may hold.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '-'
	}, s)
}

// parsePartitions reads "all" or a comma list of partitions and ranges.
func parsePartitions(s string) ([]int, error) {
	if s == "" || s == "all" {
		return nil, nil
	}
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("%q is not a partition", part)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				return nil, fmt.Errorf("%q is not a partition range", part)
			}
		}
		if a < 0 || b >= subject.Partitions || a > b {
			return nil, fmt.Errorf("%q is outside 0-%d", part, subject.Partitions-1)
		}
		for p := a; p <= b; p++ {
			out = append(out, p)
		}
	}
	return out, nil
}

func run(args []string, log *slog.Logger) error {
	o, key, err := parse(args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	parts, _ := parsePartitions(o.partitions)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	vault, err := engine.NewVault(key)
	if err != nil {
		return err
	}
	nc, js, err := o.nats.ConnectJetStream(ctx, "converge "+o.workerID)
	if err != nil {
		return err
	}
	defer nc.Close()
	reg := ops.NewRegistry()
	w, err := converge.New(ctx, converge.Config{
		JS:               js,
		MLS:              converge.EngineMLS{Vault: vault},
		WorkerID:         o.workerID,
		Partitions:       parts,
		LeaseTTL:         o.leaseTTL,
		CleanupInterval:  o.cleanupInterval,
		SnapshotEvery:    o.snapshotEvery,
		IdleAfter:        o.idleAfter,
		MessageRetention: o.retention,
		MaxBatch:         o.maxBatch,
		KeyPackagePool:   o.keyPackagePool,
		SelfUpdateAfter:  o.selfUpdate,
		Metrics:          converge.NewMetrics(reg),
		Logger:           log,
	})
	if err != nil {
		return err
	}
	srv, err := ops.New(o.listen, reg)
	if err != nil {
		return err
	}
	srv.AddReady(w.Ready)
	srv.AddReady(func(context.Context) error {
		if !nc.IsConnected() {
			return errors.New("not connected to NATS")
		}
		return nil
	})
	log.Info("converge started", "listen", srv.Addr())
	err = ops.Run(ctx, w, srv.Serving(5*time.Second))
	log.Info("converge drained")
	return err
}
