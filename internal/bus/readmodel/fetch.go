package readmodel

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/refusal"
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

// ErrBehind: the copy of a stream that answered a page stayed behind what
// its leader stored for longer than behindWait.
var ErrBehind = refusal.New(refusal.Unavailable, "replica_behind", "the stream's copy that answered is behind its leader; retry")

// behindWait bounds how long ScanCurrent asks again for an answer as new
// as the leader's.
const behindWait = 2 * time.Second

// LastSeq reads from stream's leader the sequence of its newest message on
// filter (wildcards allowed); 0 when there is none.
func LastSeq(ctx context.Context, js jetstream.JetStream, stream, filter string) (uint64, error) {
	m, err := bus.GetMsg(ctx, js, stream, bus.MsgRequest{LastBySubject: filter})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the leader's last: %w", err)
	}
	return m.Sequence, nil
}

// ScanCurrent is Scan answered by a copy of the stream that holds
// sequence leaderLast, the newest message on filter the stream's leader
// stored (LastSeq) before the scan: 0 takes any answer. A batched direct
// get is answered by any replica, or a mirror with MirrorDirect, and a
// copy may lag the leader, so a page read once an event arrived could miss
// the change the event reports (EVENT-010). A copy applies the stream in
// order, so one that holds leaderLast holds every change before it: an
// answer that reaches the end of filter without leaderLast came from a
// copy behind it and is asked again, until behindWait (ErrBehind).
func ScanCurrent(ctx context.Context, js jetstream.JetStream, stream, filter string, from uint64, n int, leaderLast uint64) ([]Stored, error) {
	wait, deadline := time.Millisecond, time.Now().Add(behindWait)
	for {
		got, err := Scan(ctx, js, stream, filter, from, n)
		if err != nil || !behind(got, from, leaderLast) {
			return got, err
		}
		if time.Now().After(deadline) {
			return nil, ErrBehind
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// behind reports whether a scan from sequence from reached the end of its
// filter without leaderLast. A scan that ends before the end (its last
// message has more pending: its count or byte bound) shows nothing either
// way.
func behind(got []Stored, from, leaderLast uint64) bool {
	if leaderLast == 0 || leaderLast < from {
		return false
	}
	if len(got) == 0 {
		return true
	}
	end := got[len(got)-1]
	return end.Pending == 0 && end.Seq < leaderLast
}

// ScanKV reads up to n entries of a KV bucket whose keys start with
// prefix + ".", in the order they were last written, at or after bucket
// sequence from: each Stored's Subject is the rest of its key; a deleted
// key has no Data. The answer holds every write the bucket's leader had
// stored under the prefix when the scan began (ScanCurrent).
func ScanKV(ctx context.Context, js jetstream.JetStream, bucket, prefix string, from uint64, n int) ([]Stored, error) {
	subj := streams.KVSubject(bucket, prefix+".")
	stream := streams.KVStream(bucket)
	last, err := LastSeq(ctx, js, stream, subj+">")
	if err != nil {
		return nil, err
	}
	got, err := ScanCurrent(ctx, js, stream, subj+">", from, n, last)
	for i := range got {
		got[i].Subject = strings.TrimPrefix(got[i].Subject, subj)
	}
	return got, err
}
