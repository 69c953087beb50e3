package engine

import (
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/thomas-vilte/mls-go/ciphersuite"
	"github.com/thomas-vilte/mls-go/credentials"
	"github.com/thomas-vilte/mls-go/keypackages"

	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// DefaultCipherSuite is MLS_128_DHKEMX25519_AES128GCM_SHA256_Ed25519 (DESIGN §2).
const DefaultCipherSuite uint16 = 1

// AccountIDLen is the length of an account id (DESIGN §2).
const AccountIDLen = 32

// Installation is one hosted MLS installation: an account id carried in a
// BasicCredential, a leaf signature key, and the KeyPackages it has handed
// out that are not consumed yet. Its private keys never appear in its String
// or formatted output, nor in errors; persist it only through a [Vault]. An
// Installation is not safe for concurrent use.
type Installation struct {
	account     []byte
	suite       ciphersuite.CipherSuite
	sigPub      []byte
	ed25519Priv ed25519.PrivateKey // suites 1 and 3
	ecdsaPriv   *ecdsa.PrivateKey  // suite 2
	keyPackages map[string]*keyPackageEntry
}

// keyPackageEntry is one KeyPackage with its private HPKE keys.
type keyPackageEntry struct {
	kp       *keypackages.KeyPackage
	raw      []byte // the KeyPackage struct, without the MLSMessage header
	initPriv []byte
	encPriv  []byte
}

// CreateInstallation generates a fresh installation for a 32-byte account id
// under cipher suite suite (0 selects [DefaultCipherSuite]; 1–3 are accepted).
// It has no KeyPackages until [Installation.NewKeyPackages].
func CreateInstallation(accountID []byte, suite uint16) (*Installation, error) {
	if len(accountID) != AccountIDLen {
		return nil, errors.New("engine: account id must be 32 bytes")
	}
	if suite == 0 {
		suite = DefaultCipherSuite
	}
	if !SupportedCipherSuite(suite) {
		return nil, fail("create installation", schema.CategoryUnsupportedRequiredFeature, ErrCipherSuite)
	}
	inst := &Installation{
		account:     slices.Clone(accountID),
		suite:       ciphersuite.CipherSuite(suite),
		keyPackages: make(map[string]*keyPackageEntry),
	}
	if inst.suite.SignatureScheme() == ciphersuite.ED25519 {
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("engine: generate signature key: %w", err)
		}
		inst.sigPub, inst.ed25519Priv = pub, priv
	} else {
		priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("engine: generate signature key: %w", err)
		}
		if err := inst.setECDSA(priv); err != nil {
			return nil, err
		}
	}
	return inst, nil
}

func (inst *Installation) setECDSA(priv *ecdsa.PrivateKey) error {
	pub, err := priv.PublicKey.Bytes()
	if err != nil {
		return fmt.Errorf("engine: signature public key: %w", err)
	}
	inst.ecdsaPriv, inst.sigPub = priv, pub
	return nil
}

// ImportInstallation builds an installation from given key material, as the
// RFC 9420 passive-client test vectors provide it: a KeyPackage (as an
// MLSMessage), the leaf's signature private key, and the KeyPackage's
// encryption and init private keys. The account id is the KeyPackage's
// credential identity.
func ImportInstallation(keyPackageMessage, signaturePriv, encryptionPriv, initPriv []byte) (*Installation, error) {
	const op = "import installation"
	kp, raw, err := parseKeyPackageMessage(keyPackageMessage)
	if err != nil {
		return nil, err
	}
	if kp.LeafNode == nil || kp.LeafNode.Credential == nil || len(kp.LeafNode.Credential.Identity) == 0 {
		return nil, fail(op, schema.CategoryInvalidEncoding, errors.New("key package has no basic credential identity"))
	}
	inst := &Installation{
		account:     slices.Clone(kp.LeafNode.Credential.Identity),
		suite:       kp.CipherSuite,
		keyPackages: make(map[string]*keyPackageEntry),
	}
	if err := inst.setSignaturePrivate(signaturePriv); err != nil {
		return nil, err
	}
	entry := &keyPackageEntry{kp: kp, raw: raw, initPriv: slices.Clone(initPriv), encPriv: slices.Clone(encryptionPriv)}
	if _, err := entry.privateKeys(inst.suite); err != nil {
		return nil, err
	}
	inst.keyPackages[string(inst.ref(raw))] = entry
	return inst, nil
}

// setSignaturePrivate installs a signature private key in its RFC 9420
// test-vector form: an Ed25519 seed, or a P-256 scalar.
func (inst *Installation) setSignaturePrivate(b []byte) error {
	if inst.suite.SignatureScheme() == ciphersuite.ED25519 {
		if len(b) != ed25519.SeedSize {
			return errors.New("engine: Ed25519 signature key is not a 32-byte seed")
		}
		inst.ed25519Priv = ed25519.NewKeyFromSeed(b)
		inst.sigPub = slices.Clone(inst.ed25519Priv.Public().(ed25519.PublicKey))
		return nil
	}
	priv, err := ecdsa.ParseRawPrivateKey(elliptic.P256(), b)
	if err != nil {
		return errors.New("engine: invalid P-256 signature key")
	}
	return inst.setECDSA(priv)
}

// signaturePrivateBytes returns the key in the form setSignaturePrivate reads.
func (inst *Installation) signaturePrivateBytes() ([]byte, error) {
	if inst.ed25519Priv != nil {
		return slices.Clone(inst.ed25519Priv.Seed()), nil
	}
	b, err := inst.ecdsaPriv.Bytes()
	if err != nil {
		return nil, errors.New("engine: encode signature key")
	}
	return b, nil
}

func parseKeyPackageMessage(msg []byte) (*keypackages.KeyPackage, []byte, error) {
	const op = "key package"
	c, err := Classify(msg)
	if err != nil {
		return nil, nil, err
	}
	if c.WireFormat != WireKeyPackage {
		return nil, nil, fail(op, schema.CategoryInvalidEncoding, errors.New("not a KeyPackage message"))
	}
	raw := slices.Clone(msg[4:])
	kp, err := keypackages.UnmarshalKeyPackage(raw)
	if err != nil {
		return nil, nil, fail(op, schema.CategoryInvalidEncoding, err)
	}
	return kp, raw, nil
}

func (e *keyPackageEntry) privateKeys(cs ciphersuite.CipherSuite) (*keypackages.KeyPackagePrivateKeys, error) {
	curve := ecdh.X25519()
	if cs == ciphersuite.MLS128DHKEMP256 {
		curve = ecdh.P256()
	}
	initKey, err := curve.NewPrivateKey(e.initPriv)
	if err != nil {
		return nil, errors.New("engine: invalid init private key")
	}
	keys := &keypackages.KeyPackagePrivateKeys{InitKey: initKey}
	if len(e.encPriv) > 0 {
		if keys.EncryptionKey, err = curve.NewPrivateKey(e.encPriv); err != nil {
			return nil, errors.New("engine: invalid encryption private key")
		}
	}
	return keys, nil
}

// AccountID returns the account id (the BasicCredential identity).
func (inst *Installation) AccountID() []byte { return slices.Clone(inst.account) }

// InboxID returns the lowercase hex of the account id.
func (inst *Installation) InboxID() string { return hex.EncodeToString(inst.account) }

// InstallationKey returns the leaf signature public key (32 bytes for
// Ed25519 suites; an uncompressed P-256 point for suite 2).
func (inst *Installation) InstallationKey() []byte { return slices.Clone(inst.sigPub) }

// ClientID returns the lowercase hex of the installation key.
func (inst *Installation) ClientID() string { return hex.EncodeToString(inst.sigPub) }

// CipherSuite returns the installation's cipher suite.
func (inst *Installation) CipherSuite() uint16 { return uint16(inst.suite) }

// String describes the installation without any key material.
func (inst *Installation) String() string {
	return fmt.Sprintf("engine.Installation{suite:%d keyPackages:%d}", inst.suite, len(inst.keyPackages))
}

// Format makes every fmt verb print String, so no verb (%v, %+v, %#v, %x)
// can reach a private key.
func (inst *Installation) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(inst.String())) }

// NewKeyPackages generates n fresh KeyPackages and returns them as
// MLSMessage bytes (wire format mls_key_package), ready to hand out.
func (inst *Installation) NewKeyPackages(n int) ([][]byte, error) {
	cred := &credentials.CredentialWithKey{
		Credential:        credentials.NewBasicCredential(slices.Clone(inst.account)),
		SignatureKeyBytes: slices.Clone(inst.sigPub),
	}
	if inst.ed25519Priv != nil {
		cred.Ed25519PrivateKey = inst.ed25519Priv
	} else {
		cred.PrivateKey, cred.SignatureKey = inst.ecdsaPriv, &inst.ecdsaPriv.PublicKey
	}
	out := make([][]byte, 0, n)
	for range n {
		kp, priv, err := components.GenerateKeyPackage(cred, inst.suite)
		if err != nil {
			return nil, fmt.Errorf("engine: generate key package: %w", err)
		}
		raw := kp.Marshal()
		e := &keyPackageEntry{kp: kp, raw: raw, initPriv: priv.InitKey.Bytes(), encPriv: priv.EncryptionKey.Bytes()}
		inst.keyPackages[string(inst.ref(raw))] = e
		out = append(out, keyPackageMessage(raw))
	}
	return out, nil
}

func keyPackageMessage(raw []byte) []byte {
	return append([]byte{0, 1, 0, byte(WireKeyPackage)}, raw...)
}

// KeyPackageRefs returns the refs of the KeyPackages not yet consumed, sorted.
func (inst *Installation) KeyPackageRefs() [][]byte {
	refs := slices.Sorted(maps.Keys(inst.keyPackages))
	out := make([][]byte, len(refs))
	for i, r := range refs {
		out[i] = []byte(r)
	}
	return out
}

// KeyPackageMessage returns the MLSMessage of an unconsumed KeyPackage.
func (inst *Installation) KeyPackageMessage(ref []byte) ([]byte, bool) {
	e, ok := inst.keyPackages[string(ref)]
	if !ok {
		return nil, false
	}
	return keyPackageMessage(e.raw), true
}

// RemoveKeyPackage forgets a KeyPackage and its private keys: after a join
// is stored (Marmot joining.md steps 11–12), or when it is retired.
func (inst *Installation) RemoveKeyPackage(ref []byte) bool {
	_, ok := inst.keyPackages[string(ref)]
	delete(inst.keyPackages, string(ref))
	return ok
}

func (inst *Installation) ref(raw []byte) []byte {
	return ciphersuite.MakeKeyPackageRef(raw, inst.suite.HashFunction()).AsSlice()
}

// KeyPackageRef returns the RFC 9420 §5.2 KeyPackageRef of a KeyPackage
// MLSMessage: RefHash("MLS 1.0 KeyPackage Reference", KeyPackage).
func KeyPackageRef(keyPackageMessage []byte) ([]byte, error) {
	kp, raw, err := parseKeyPackageMessage(keyPackageMessage)
	if err != nil {
		return nil, err
	}
	if !SupportedCipherSuite(uint16(kp.CipherSuite)) {
		return nil, fail("key package", schema.CategoryUnsupportedRequiredFeature, ErrCipherSuite)
	}
	return ciphersuite.MakeKeyPackageRef(raw, kp.CipherSuite.HashFunction()).AsSlice(), nil
}
