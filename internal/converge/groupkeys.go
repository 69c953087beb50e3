package converge

import (
	"errors"
	"fmt"

	"github.com/fabric-mls/fabric/internal/engine"
)

// errKeyNotSealed reports a group event key in a state record that does not
// open under the master key: sealed under another key, or unsealed by a
// fabric from before group event keys were sealed, which is not read
// (docs/converge.md).
var errKeyNotSealed = errors.New("converge: a group event key in the state record is not sealed under this master key")

// sealKeys seals each key of plain: a group event key peels every sealed
// transport message of its group, so it is kept at rest as every private
// key is.
func sealKeys(v *engine.Vault, plain []epochKey) ([]epochKey, error) {
	out := make([]epochKey, len(plain))
	for i, k := range plain {
		s, err := v.SealGroupEventKeys(k.Key)
		if err != nil {
			return nil, fmt.Errorf("seal group event key: %w", err)
		}
		out[i] = epochKey{Epoch: k.Epoch, Key: s}
	}
	return out, nil
}

// openKeys opens what sealKeys sealed.
func openKeys(v *engine.Vault, sealed []epochKey) ([]epochKey, error) {
	out := make([]epochKey, len(sealed))
	for i, k := range sealed {
		p, err := v.OpenGroupEventKeys(k.Key)
		if err != nil {
			return nil, fmt.Errorf("epoch %d: %w", k.Epoch, errKeyNotSealed)
		}
		out[i] = epochKey{Epoch: k.Epoch, Key: p}
	}
	return out, nil
}
