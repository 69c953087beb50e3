package testpeer

import (
	"crypto/sha256"
	"fmt"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// Sample is one real message of a kind, named for test and corpus names.
type Sample struct {
	Name string
	Message
}

// Samples returns one real message of every wire format and content type a
// transport carries, all of one group made afresh: a commit adding a member
// (an Add with its KeyPackage, and an UpdatePath), the Welcome for it, an
// application PrivateMessage, a proposal (a leave request), an empty
// commit, a GroupInfo and a KeyPackage. Seeds for decoders and fuzzers.
func Samples() ([]Sample, error) {
	alice, err := New("alice")
	if err != nil {
		return nil, err
	}
	bob, err := New("bob")
	if err != nil {
		return nil, err
	}
	a, err := alice.CreateGroup(components.Set{Admins: []components.AccountID{alice.AccountID()}})
	if err != nil {
		return nil, err
	}
	kp, err := bob.KeyPackage()
	if err != nil {
		return nil, err
	}
	add, welcome, err := a.Invite(kp)
	if err != nil {
		return nil, err
	}
	b, err := bob.Join(welcome.Transport)
	if err != nil {
		return nil, err
	}
	app, err := a.SendText("sample")
	if err != nil {
		return nil, err
	}
	leave, err := b.Leave()
	if err != nil {
		return nil, err
	}
	empty, err := a.Commit()
	if err != nil {
		return nil, err
	}
	info, err := a.GroupInfo()
	if err != nil {
		return nil, err
	}
	carol, err := New("carol")
	if err != nil {
		return nil, err
	}
	kpMLS, err := carol.KeyPackage()
	if err != nil {
		return nil, fmt.Errorf("testpeer: samples: %w", err)
	}
	id := sha256.Sum256(kpMLS)
	keyPackage := Message{
		Transport: schema.TransportMessage{V: schema.TransportVersion, Group: a.ID(), Kind: schema.TransportMLS, Payload: kpMLS},
		MLS:       kpMLS,
		ID:        id[:],
	}
	return []Sample{
		{"commit-add", add},
		{"welcome", welcome},
		{"application", app},
		{"proposal-remove", leave},
		{"commit-empty", empty},
		{"group-info", info},
		{"key-package", keyPackage},
	}, nil
}
