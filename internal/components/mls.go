package components

import (
	"errors"
	"fmt"
	"slices"

	"github.com/thomas-vilte/mls-go/ciphersuite"
	"github.com/thomas-vilte/mls-go/credentials"
	mlsext "github.com/thomas-vilte/mls-go/extensions"
	"github.com/thomas-vilte/mls-go/keypackages"
)

// ToExtension returns s as the mls-go GroupContext extension.
func ToExtension(s Set) (mlsext.Extension, error) {
	b, err := Encode(s)
	if err != nil {
		return mlsext.Extension{}, err
	}
	return mlsext.Extension{Type: mlsext.ExtensionType(ExtensionType), Data: b}, nil
}

// ErrDuplicateExtension is returned when a GroupContext carries the
// components extension twice.
var ErrDuplicateExtension = errors.New("components: extension present twice")

// FromExtensions finds and decodes the components extension in a
// GroupContext's extensions. found is false (and the set empty) when the
// group carries none.
func FromExtensions(exts []mlsext.Extension) (s Set, found bool, err error) {
	for _, e := range exts {
		if uint16(e.Type) != ExtensionType {
			continue
		}
		if found {
			return Set{}, false, ErrDuplicateExtension
		}
		found = true
		if s, err = Decode(e.Data); err != nil {
			return Set{}, false, err
		}
	}
	return s, found, nil
}

// GenerateKeyPackage is mls-go's keypackages.Generate with [ExtensionType]
// listed in the leaf's capabilities. Every group the fabric makes carries
// the extension, and RFC 9420 §13 has an adder check that the new member's
// capabilities list every non-default GroupContext extension: a strict
// peer refuses to add, or to follow an add of, a leaf that does not
// (ts-mls: "Added leaf node that doesn't support extension in
// GroupContext"). mls-go's generator takes no capabilities, so the leaf
// node and the KeyPackage are signed again after the change. Leaves made
// from the KeyPackage later (the creator's, a commit's update path) copy
// its capabilities. The fabric uses only default proposal types, which
// capabilities must not list (RFC 9420 §7.2).
func GenerateKeyPackage(cred *credentials.CredentialWithKey, suite ciphersuite.CipherSuite) (*keypackages.KeyPackage, *keypackages.KeyPackagePrivateKeys, error) {
	kp, priv, err := keypackages.Generate(cred, suite)
	if err != nil {
		return nil, nil, err
	}
	ln := kp.LeafNode
	if slices.Contains(ln.Capabilities.Extensions, ExtensionType) {
		return kp, priv, nil
	}
	ln.Capabilities.Extensions = append(ln.Capabilities.Extensions, ExtensionType)
	signer := priv.GetSignaturePrivateKey()
	// A KeyPackage's LeafNodeTBS is the leaf node without its signature
	// (RFC 9420 §7.2, leaf_node_source key_package): the node encoded with
	// an empty signature, less that signature's one-byte length.
	ln.Signature = nil
	tbs := ln.Marshal()
	sig, err := ciphersuite.SignWithLabel(signer, "LeafNodeTBS", tbs[:len(tbs)-1])
	if err != nil {
		return nil, nil, fmt.Errorf("components: sign leaf node: %w", err)
	}
	ln.Signature = sig.AsSlice()
	sig, err = ciphersuite.SignWithLabel(signer, "KeyPackageTBS", kp.MarshalTBS())
	if err != nil {
		return nil, nil, fmt.Errorf("components: sign key package: %w", err)
	}
	kp.Signature = sig.AsSlice()
	return kp, priv, nil
}

// Supports reports whether capabilities listing exts support every
// GroupContext extension of a group: each one RFC 9420 §7.2 does not call
// default (0x0001–0x0005) must be listed (RFC 9420 §13, the adder's check).
func Supports(exts []uint16, gc []mlsext.Extension) bool {
	for _, e := range gc {
		def := e.Type >= mlsext.ExtensionTypeApplicationID && e.Type <= mlsext.ExtensionTypeExternalSenders
		if !def && !slices.Contains(exts, uint16(e.Type)) {
			return false
		}
	}
	return true
}
