package engine

import (
	"errors"
	"slices"

	"github.com/thomas-vilte/mls-go/ciphersuite"
	"github.com/thomas-vilte/mls-go/secrettree"

	"github.com/fabric-mls/fabric/pkg/schema"
)

// PastEpoch is what an epoch a commit left still needs to open late
// application messages of that epoch: its sender-data secret, its secret
// tree and its members' signature keys. The rest of the epoch (init,
// exporter, membership and confirmation secrets, the tree's and members'
// private keys) is gone with the State it came from, as RFC 9420 §9.2
// asks once a commit moved on; how long a PastEpoch is kept is the
// caller's choice (RFC 9420 §14: a window for late messages).
type PastEpoch struct {
	groupID    []byte
	epoch      uint64
	suite      ciphersuite.CipherSuite
	senderData *ciphersuite.Secret
	tree       *secrettree.Tree
	context    []byte
	sigs       *SignatureCache
	members    map[uint32]pastMember
}

type pastMember struct {
	m   Member
	key []byte
}

// PastEpoch returns s's epoch for late application messages. It takes s's
// secret tree: s must not decrypt or encrypt after it.
func (s *State) PastEpoch() *PastEpoch {
	p := &PastEpoch{
		groupID: s.GroupID(),
		epoch:   s.Epoch(),
		suite:   s.g.CipherSuite(),
		tree:    s.g.SecretTree(),
		context: s.g.GroupContext().Marshal(),
		sigs:    s.sigs,
		members: make(map[uint32]pastMember),
	}
	if secrets := s.g.EpochSecrets(); secrets != nil {
		p.senderData = secrets.SenderDataSecret
	}
	for _, m := range s.Members() {
		p.members[m.Leaf] = pastMember{m: m, key: m.InstallationKey}
	}
	return p
}

// Epoch returns the epoch.
func (p *PastEpoch) Epoch() uint64 { return p.epoch }

// Decrypt is [State.Decrypt] for a message of this past epoch.
func (p *PastEpoch) Decrypt(mlsMessage []byte) (app *Application, err error) {
	const op = "decrypt"
	defer recoverDecode(op, &err)
	c, err := classifyApplication(op, mlsMessage)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(c.GroupID, p.groupID) {
		return nil, fail(op, schema.CategoryWrongRecipient, ErrWrongGroup)
	}
	if c.Epoch != p.epoch {
		return nil, fail(op, schema.CategoryStaleEpoch, ErrWrongEpoch)
	}
	if p.senderData == nil || p.tree == nil {
		return nil, fail(op, schema.CategoryInvalidEncoding, errors.New("epoch secrets missing"))
	}
	pm, err := parsePrivate(op, mlsMessage)
	if err != nil {
		return nil, err
	}
	return openApplication(op, c, pm, epochKeys{
		suite:      p.suite,
		senderData: p.senderData,
		tree:       p.tree,
		context:    p.context,
		sigs:       p.sigs,
		sender: func(leaf uint32) (Member, []byte, error) {
			m, ok := p.members[leaf]
			if !ok {
				return Member{}, nil, fail(op, schema.CategoryInvalidSignature, errors.New("sender leaf is blank"))
			}
			return m.m, m.key, nil
		},
	})
}
