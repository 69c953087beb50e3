package engine

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/thomas-vilte/mls-go/ciphersuite"
	"github.com/thomas-vilte/mls-go/keypackages"
)

// Vault seals private material at rest under a configured 32-byte master key
// with AES-256-GCM. Each sealed blob is bound to what it holds by a label in
// the associated data, so an installation blob never opens as group state.
type Vault struct {
	aead cipher.AEAD
	// prk is the HKDF-SHA256 pseudorandom key of the master key, from
	// which Derive expands keys of other uses.
	prk []byte
}

// Sealed blob layout: version byte 1 || nonce(12) || ciphertext||tag.
const vaultVersion = 1

// Labels of what a Vault seals.
const (
	labelInstallation = "fabric/installation/v1"
	labelState        = "fabric/group-state/v1"
	labelGroupKeys    = "fabric/group-event-keys/v1"
	labelDerive       = "fabric/derive/v1"
)

// NewVault returns a Vault for a 32-byte master key.
func NewVault(masterKey []byte) (*Vault, error) {
	if len(masterKey) != 32 {
		return nil, errors.New("engine: master key must be 32 bytes")
	}
	block, err := aes.NewCipher(masterKey)
	if err != nil {
		return nil, fmt.Errorf("engine: master key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("engine: master key: %w", err)
	}
	prk, err := hkdf.Extract(sha256.New, masterKey, []byte(labelDerive))
	if err != nil {
		return nil, fmt.Errorf("engine: master key: %w", err)
	}
	return &Vault{aead: aead, prk: prk}, nil
}

// Derive returns an n-byte key for label and info, HKDF-SHA256 expanded
// from the master key: a use of its own, such as a tenant's message
// content key (internal/readmodel), never the master key itself.
func (v *Vault) Derive(label string, info []byte, n int) ([]byte, error) {
	return hkdf.Expand(sha256.New, v.prk, label+"\x00"+string(info), n)
}

// String never shows the key.
func (v *Vault) String() string { return "engine.Vault{}" }

// Format makes every fmt verb print String.
func (v *Vault) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(v.String())) }

func (v *Vault) seal(label string, plaintext []byte) ([]byte, error) {
	return v.appendSeal(nil, label, plaintext)
}

// appendSeal appends the sealed plaintext to dst, growing it once.
func (v *Vault) appendSeal(dst []byte, label string, plaintext []byte) ([]byte, error) {
	n := v.aead.NonceSize()
	dst = slices.Grow(dst, 1+n+len(plaintext)+v.aead.Overhead())
	at := len(dst)
	dst = append(dst, vaultVersion)
	dst = dst[:at+1+n]
	nonce := dst[at+1:]
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("engine: seal nonce: %w", err)
	}
	return v.aead.Seal(dst, nonce, plaintext, []byte(label)), nil
}

func (v *Vault) open(label string, sealed []byte) ([]byte, error) {
	n := v.aead.NonceSize()
	if len(sealed) < 1+n+v.aead.Overhead() || sealed[0] != vaultVersion {
		return nil, ErrSealed
	}
	pt, err := v.aead.Open(nil, sealed[1:1+n], sealed[1+n:], []byte(label))
	if err != nil {
		return nil, ErrSealed
	}
	return pt, nil
}

// sealedInstallation is the plaintext form of a sealed installation.
type sealedInstallation struct {
	Account     []byte             `json:"account"`
	Suite       uint16             `json:"suite"`
	SigPriv     []byte             `json:"sig_priv"`
	KeyPackages []sealedKeyPackage `json:"key_packages"`
}

type sealedKeyPackage struct {
	KeyPackage []byte `json:"key_package"`
	InitPriv   []byte `json:"init_priv"`
	EncPriv    []byte `json:"enc_priv"`
}

// Seal encrypts an installation with its private keys and KeyPackages.
func (v *Vault) Seal(inst *Installation) ([]byte, error) {
	sig, err := inst.signaturePrivateBytes()
	if err != nil {
		return nil, err
	}
	s := sealedInstallation{Account: inst.account, Suite: uint16(inst.suite), SigPriv: sig}
	for _, ref := range slices.Sorted(maps.Keys(inst.keyPackages)) {
		e := inst.keyPackages[ref]
		s.KeyPackages = append(s.KeyPackages, sealedKeyPackage{KeyPackage: e.raw, InitPriv: e.initPriv, EncPriv: e.encPriv})
	}
	pt, err := json.Marshal(s)
	if err != nil {
		return nil, errors.New("engine: encode installation")
	}
	defer clear(pt)
	return v.seal(labelInstallation, pt)
}

// Open decrypts an installation sealed by Seal under the same master key.
func (v *Vault) Open(sealed []byte) (*Installation, error) {
	pt, err := v.open(labelInstallation, sealed)
	if err != nil {
		return nil, err
	}
	defer clear(pt)
	var s sealedInstallation
	if err := json.Unmarshal(pt, &s); err != nil {
		return nil, ErrSealed
	}
	if !SupportedCipherSuite(s.Suite) || len(s.Account) == 0 {
		return nil, ErrSealed
	}
	inst := &Installation{
		account:     s.Account,
		suite:       ciphersuite.CipherSuite(s.Suite),
		keyPackages: make(map[string]*keyPackageEntry),
	}
	if err := inst.setSignaturePrivate(s.SigPriv); err != nil {
		return nil, ErrSealed
	}
	for _, k := range s.KeyPackages {
		kp, err := keypackages.UnmarshalKeyPackage(k.KeyPackage)
		if err != nil {
			return nil, ErrSealed
		}
		e := &keyPackageEntry{kp: kp, raw: k.KeyPackage, initPriv: k.InitPriv, encPriv: k.EncPriv}
		inst.keyPackages[string(inst.ref(k.KeyPackage))] = e
	}
	return inst, nil
}

// SealState encrypts a group state snapshot (see [State.Snapshot]), which
// holds epoch secrets and private path keys.
func (v *Vault) SealState(snapshot []byte) ([]byte, error) { return v.seal(labelState, snapshot) }

// AppendSealState is SealState appending the sealed bytes to dst, as a
// prefix to them, without a copy of its own.
func (v *Vault) AppendSealState(dst, snapshot []byte) ([]byte, error) {
	return v.appendSeal(dst, labelState, snapshot)
}

// OpenState decrypts what SealState sealed.
func (v *Vault) OpenState(sealed []byte) ([]byte, error) { return v.open(labelState, sealed) }

// SealGroupEventKeys encrypts group event keys, or what holds them (a
// fabric-group-keys value, a key in converge's state record): whoever reads
// them peels every sealed transport message of the group.
func (v *Vault) SealGroupEventKeys(plaintext []byte) ([]byte, error) {
	return v.seal(labelGroupKeys, plaintext)
}

// OpenGroupEventKeys decrypts what SealGroupEventKeys sealed.
func (v *Vault) OpenGroupEventKeys(sealed []byte) ([]byte, error) {
	return v.open(labelGroupKeys, sealed)
}
