package converge

import (
	"context"
	"encoding/hex"
	"strconv"
	"time"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// selfUpdateDue is when member m's scheduled self-update is due (unix ms)
// under period: period after its leaf was renewed or, while a scheduled
// one has not renewed it, period after that one ran. 0 when the schedule
// is off or the member cannot commit (forked).
func selfUpdateDue(m *hostedMember, period time.Duration) int64 {
	if period <= 0 || m.LeafAt == 0 || m.Removed || m.Forked {
		return 0
	}
	return max(m.LeafAt, m.SelfUpdateAsked) + period.Milliseconds()
}

// stampLeaves starts the leaf age of the members a transaction sees first
// (a join, a create, or a state from before LeafAt was kept).
func (t *txn) stampLeaves() {
	for _, m := range t.g.active() {
		if m.LeafAt == 0 {
			m.LeafAt = t.now
		}
	}
}

// nextDue is when the group next needs a pass without input: an expiry, a
// convergence pass, or a member's scheduled self-update.
func (g *groupState) nextDue(period time.Duration) int64 {
	next := g.nextExpiry()
	for _, m := range g.active() {
		if at := selfUpdateDue(m, period); at != 0 && (next == 0 || at < next) {
			next = at
		}
	}
	return next
}

// selfUpdates runs the scheduled self-update (issue 19: post-compromise
// security) of every active member whose leaf is older than period: the
// operation POST …/update asks for, executed in this transaction by the
// same path, so its commit, its record and the state that marks it run are
// stored in one fenced batch, serialized with the group's input (exactly
// once). Its id is derived from the client, the group and the due time, so
// a transaction retried after a lost fence runs the same operation.
func (p marmot) selfUpdates(ctx context.Context, t *txn, period time.Duration) (bool, error) {
	ran := false
	for _, m := range t.g.active() {
		due := selfUpdateDue(m, period)
		if due == 0 || due > t.now {
			continue
		}
		req := bus.OperationRequest{ID: scheduledSelfUpdateID(t.tenant, m.ClientID, t.g.GroupID, due), Kind: schema.OpSelfUpdate, ClientID: m.ClientID, GroupID: t.g.GroupID, Time: t.now}
		data, err := bus.EncodeOperation(req)
		if err != nil {
			return ran, err
		}
		m.SelfUpdateAsked = t.now
		if err := p.operate(ctx, t, input{Class: bus.ClassOperation, MessageID: req.ID, Data: data, Time: t.now}); err != nil {
			return ran, err
		}
		ran = true
	}
	return ran, nil
}

// scheduledSelfUpdateID names a scheduled self-update as an operation of
// its client whose Idempotency-Key no request can carry (a header value
// holds no NUL), so it never meets an app's operation.
func scheduledSelfUpdateID(tenant, clientID string, group []byte, due int64) []byte {
	return bus.OperationID(tenant, clientID, "\x00self-update\x00"+hex.EncodeToString(group)+"\x00"+strconv.FormatInt(due, 10))
}
