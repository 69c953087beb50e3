// Package testpeer provides remote MLS members for tests and the demo: plain
// RFC 9420 installations built directly on mls-go (not on internal/engine),
// that create groups, invite, commit, send app payloads, leave and fork, and
// hand back what they produce as fabric-native/1 transport messages.
//
// Peers follow the fabric's protocol choices (DESIGN section 2): cipher suite
// 0x0001, the 32-byte account id as BasicCredential identity, commits and
// proposals as PublicMessage, application messages as PrivateMessage,
// components in one GroupContext extension changed by GroupContextExtensions
// proposals and listed in the capabilities of every KeyPackage (RFC 9420
// §13), and a leave request as a Remove proposal of the leaver's own leaf
// that another member commits.
//
// Several peers of one group stay consistent by processing each other's
// output with [Group.Process]; a peer recognises its own output there and
// skips it, so a test may hand every message to every peer.
//
// A Peer and its Groups are not safe for concurrent use.
package testpeer

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/thomas-vilte/mls-go/ciphersuite"
	"github.com/thomas-vilte/mls-go/credentials"
	"github.com/thomas-vilte/mls-go/framing"
	"github.com/thomas-vilte/mls-go/keypackages"

	"github.com/fabric-mls/fabric/internal/components"
)

// CipherSuite is the cipher suite every peer uses (DESIGN section 2).
const CipherSuite = ciphersuite.MLS128DHKEMX25519

// Peer is one remote MLS installation: an account id and its own
// signature key, with the KeyPackages it handed out and not yet used.
type Peer struct {
	name    string
	account components.AccountID
	cred    *credentials.CredentialWithKey
	sig     *ciphersuite.SignaturePrivateKey
	pending map[string]pendingKP // keyed by the KeyPackage's bytes
}

type pendingKP struct {
	kp   *keypackages.KeyPackage
	priv *keypackages.KeyPackagePrivateKeys
}

// New returns a peer whose account id is SHA-256 of name, so tests can
// name accounts and get the same inbox id every run. Its signature key is
// fresh.
func New(name string) (*Peer, error) {
	return NewWithAccount(name, sha256.Sum256([]byte(name)))
}

// NewWithAccount returns a peer of the given account with a fresh signature
// key; two peers of one account are two installations of it.
func NewWithAccount(name string, account components.AccountID) (*Peer, error) {
	cred, sig, err := credentials.GenerateCredentialWithKeyForCS(account[:], CipherSuite)
	if err != nil {
		return nil, fmt.Errorf("testpeer %s: credential: %w", name, err)
	}
	return &Peer{name: name, account: account, cred: cred, sig: sig, pending: map[string]pendingKP{}}, nil
}

// NewInstallation returns another installation of p's account.
func (p *Peer) NewInstallation(name string) (*Peer, error) {
	return NewWithAccount(name, p.account)
}

// Name returns the name the peer was made with.
func (p *Peer) Name() string { return p.name }

// AccountID returns the 32-byte account id in the peer's credential.
func (p *Peer) AccountID() components.AccountID { return p.account }

// InboxID returns the lowercase hex of the account id.
func (p *Peer) InboxID() string { return p.account.InboxID() }

// InstallationKey returns the peer's 32-byte Ed25519 signature public key,
// the leaf's installation key.
func (p *Peer) InstallationKey() []byte { return append([]byte{}, p.cred.SignatureKeyBytes...) }

// ClientID returns the lowercase hex of the installation key.
func (p *Peer) ClientID() string { return hex.EncodeToString(p.cred.SignatureKeyBytes) }

// KeyPackage returns a fresh KeyPackage as MLSMessage bytes (wire format
// mls_key_package), the form hosted clients hand out too. The peer keeps its
// private keys until a Welcome for it arrives.
func (p *Peer) KeyPackage() ([]byte, error) {
	kp, priv, err := components.GenerateKeyPackage(p.cred, CipherSuite)
	if err != nil {
		return nil, fmt.Errorf("testpeer %s: key package: %w", p.name, err)
	}
	raw := kp.Marshal()
	p.pending[string(raw)] = pendingKP{kp: kp, priv: priv}
	return (&framing.MLSMessage{KeyPackage: raw}).Marshal(), nil
}

// ErrNoKeyPackage is returned by Join when the Welcome is for none of the
// peer's outstanding KeyPackages.
var ErrNoKeyPackage = errors.New("testpeer: welcome is for no key package of this peer")

// parseKeyPackage accepts a KeyPackage as MLSMessage bytes or bare.
func parseKeyPackage(b []byte) (*keypackages.KeyPackage, error) {
	if m, err := framing.UnmarshalMLSMessage(b); err == nil && m.KeyPackage != nil {
		b = m.KeyPackage
	}
	kp, err := keypackages.UnmarshalKeyPackage(b)
	if err != nil {
		return nil, fmt.Errorf("key package: %w", err)
	}
	return kp, nil
}
