package readmodel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus"
)

// Stored is one stored record: its stream sequence, subject and body.
type Stored struct {
	Seq     uint64
	Subject string
	Data    []byte
	// Pending is how many messages of the scan's filter follow it.
	Pending uint64
}

// Last reads the record stored on subj from the stream leader, so a read
// that follows an event sees the batch that stored it on every instance
// (EVENT-010). Seq 0 when there is none.
func Last(ctx context.Context, js jetstream.JetStream, subj string) (Stored, error) {
	seq, b, err := bus.ReadMsg(ctx, js, subj, 0)
	if err != nil {
		return Stored{}, fmt.Errorf("read %s: %w", "record", err)
	}
	return Stored{Seq: seq, Subject: subj, Data: b}, nil
}

// lastManyReads bounds the reads LastMany has in flight.
const lastManyReads = 16

// LastMany reads the records stored on subjects, as Last, in parallel;
// out[i] is subjects[i]'s.
func LastMany(ctx context.Context, js jetstream.JetStream, subjects []string) ([]Stored, error) {
	out := make([]Stored, len(subjects))
	errs := make([]error, len(subjects))
	sem := make(chan struct{}, lastManyReads)
	var wg sync.WaitGroup
	for i, s := range subjects {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out[i], errs[i] = Last(ctx, js, s)
		})
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// scanTimeout bounds a scan whose context has no deadline.
const scanTimeout = 5 * time.Second

// Scan reads up to n messages of stream matching filter at or after
// sequence from, in stream order, with one batched direct get (ADR-31).
func Scan(ctx context.Context, nc *nats.Conn, stream, filter string, from uint64, n int) ([]Stored, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, scanTimeout)
		defer cancel()
	}
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("scan: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	req, err := json.Marshal(struct {
		Seq        uint64 `json:"seq"`
		NextBySubj string `json:"next_by_subj"`
		Batch      int    `json:"batch"`
	}{max(from, 1), filter, n})
	if err != nil {
		return nil, err
	}
	if err := nc.PublishRequest("$JS.API.DIRECT.GET."+stream, inbox, req); err != nil {
		return nil, fmt.Errorf("scan: %w", err)
	}
	var out []Stored
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return nil, fmt.Errorf("scan: %w", err)
		}
		switch st := m.Header.Get("Status"); st {
		case "":
			seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
			if err != nil {
				return nil, errors.New("scan: answer without a sequence")
			}
			np, _ := strconv.ParseUint(m.Header.Get("Nats-Num-Pending"), 10, 64)
			out = append(out, Stored{Seq: seq, Subject: m.Header.Get(jetstream.SubjectHeader), Data: m.Data, Pending: np})
			if len(out) > n {
				return nil, errors.New("scan: more messages than asked for")
			}
		case "204", "404", "408":
			return out, nil
		default:
			return nil, fmt.Errorf("scan: status %s %s", st, m.Header.Get("Description"))
		}
	}
}

// Count is how many messages of stream matching filter are stored at or
// after sequence from.
func Count(ctx context.Context, nc *nats.Conn, stream, filter string, from uint64) (uint64, error) {
	s, err := Scan(ctx, nc, stream, filter, from, 1)
	if err != nil || len(s) == 0 {
		return 0, err
	}
	return s[0].Pending + 1, nil
}

// ScanKV reads up to n entries of a KV bucket whose keys start with
// prefix + ".", in the order they were last written, at or after bucket
// sequence from: each Stored's Subject is the rest of its key; a deleted
// key has no Data.
func ScanKV(ctx context.Context, nc *nats.Conn, bucket, prefix string, from uint64, n int) ([]Stored, error) {
	subj := "$KV." + bucket + "." + prefix + "."
	got, err := Scan(ctx, nc, "KV_"+bucket, subj+">", from, n)
	for i := range got {
		got[i].Subject = strings.TrimPrefix(got[i].Subject, subj)
	}
	return got, err
}
