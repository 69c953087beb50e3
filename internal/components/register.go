package components

import (
	"slices"
	_ "unsafe" // go:linkname

	_ "github.com/thomas-vilte/mls-go/keypackages" // owner of the linked variable
)

// mlsSupportedExtensionTypes is mls-go v1.6.0's list of GroupContext extension
// types a joiner accepts (RFC 9420 §13.4 check in group.JoinFromWelcome). mls-go
// has no API to extend it, and a Welcome for a group that carries the
// components extension would otherwise fail with ErrRequiredExtensionMissing.
// The list is read only by that check; appending once at init, before any
// goroutine can join a group, is race free.
//
//go:linkname mlsSupportedExtensionTypes github.com/thomas-vilte/mls-go/keypackages.supportedExtensionTypes
var mlsSupportedExtensionTypes []uint16

func init() {
	if !slices.Contains(mlsSupportedExtensionTypes, ExtensionType) {
		mlsSupportedExtensionTypes = append(mlsSupportedExtensionTypes, ExtensionType)
	}
}
