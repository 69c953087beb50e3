package components

import (
	"errors"

	mlsext "github.com/thomas-vilte/mls-go/extensions"
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
