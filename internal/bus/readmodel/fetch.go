package readmodel

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
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

// Scan reads up to n messages of stream matching filter at or after
// sequence from, in stream order, with one batched direct get (ADR-31).
func Scan(ctx context.Context, js jetstream.JetStream, stream, filter string, from uint64, n int) ([]Stored, error) {
	msgs, err := bus.NextMsgs(ctx, js, stream, filter, max(from, 1), n)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("scan: %w", err)
	}
	out := make([]Stored, 0, len(msgs))
	for _, m := range msgs {
		seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil {
			return nil, errors.New("scan: answer without a sequence")
		}
		np, _ := strconv.ParseUint(m.Header.Get("Nats-Num-Pending"), 10, 64)
		out = append(out, Stored{Seq: seq, Subject: m.Header.Get(jetstream.SubjectHeader), Data: m.Data, Pending: np})
	}
	return out, nil
}

// ScanKV reads up to n entries of a KV bucket whose keys start with
// prefix + ".", in the order they were last written, at or after bucket
// sequence from: each Stored's Subject is the rest of its key; a deleted
// key has no Data.
func ScanKV(ctx context.Context, js jetstream.JetStream, bucket, prefix string, from uint64, n int) ([]Stored, error) {
	subj := streams.KVSubject(bucket, prefix+".")
	got, err := Scan(ctx, js, streams.KVStream(bucket), subj+">", from, n)
	for i := range got {
		got[i].Subject = strings.TrimPrefix(got[i].Subject, subj)
	}
	return got, err
}
