package engine

import (
	"bytes"
	"fmt"
	"testing"
)

type passiveVector struct {
	CipherSuite  uint16 `json:"cipher_suite"`
	ExternalPsks []struct {
		PskID string `json:"psk_id"`
		Psk   string `json:"psk"`
	} `json:"external_psks"`
	KeyPackage                string  `json:"key_package"`
	SignaturePriv             string  `json:"signature_priv"`
	EncryptionPriv            string  `json:"encryption_priv"`
	InitPriv                  string  `json:"init_priv"`
	Welcome                   string  `json:"welcome"`
	RatchetTree               *string `json:"ratchet_tree"`
	InitialEpochAuthenticator string  `json:"initial_epoch_authenticator"`
	Epochs                    []struct {
		Proposals          []string `json:"proposals"`
		Commit             string   `json:"commit"`
		EpochAuthenticator string   `json:"epoch_authenticator"`
	} `json:"epochs"`
}

// runPassive follows one vector through the engine's own API: import the
// installation, join, then process every proposal and commit, checking each
// epoch authenticator.
func runPassive(t *testing.T, v passiveVector) {
	inst, err := ImportInstallation(unhex(t, v.KeyPackage), unhex(t, v.SignaturePriv), unhex(t, v.EncryptionPriv), unhex(t, v.InitPriv))
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	var tree []byte
	if v.RatchetTree != nil {
		tree = unhex(t, *v.RatchetTree)
	}
	psks := make(map[string][]byte)
	for _, p := range v.ExternalPsks {
		psks[string(unhex(t, p.PskID))] = unhex(t, p.Psk)
	}
	st, info, err := inst.Join(unhex(t, v.Welcome), tree, WithExternalPSKs(psks))
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	if !bytes.Equal(st.EpochAuthenticator(), unhex(t, v.InitialEpochAuthenticator)) {
		t.Fatalf("initial epoch authenticator mismatch")
	}
	if info.Epoch != st.Epoch() || !bytes.Equal(info.GroupID, st.GroupID()) || info.Adder.InboxID == "" {
		t.Fatalf("join info %+v", info)
	}
	if _, ok := st.Member(st.OwnLeaf()); !ok {
		t.Fatal("own leaf is not a member")
	}
	for i, e := range v.Epochs {
		for j, p := range e.Proposals {
			next, _, err := st.ProcessHandshake(unhex(t, p))
			if err != nil {
				t.Fatalf("epoch %d proposal %d: %v", i, j, err)
			}
			st = next
		}
		parentEpoch := st.Epoch()
		next, res, err := st.ProcessHandshake(unhex(t, e.Commit))
		if err != nil {
			t.Fatalf("epoch %d commit: %v", i, err)
		}
		if st.Epoch() != parentEpoch {
			t.Fatal("processing mutated the parent state")
		}
		st = next
		if st.Epoch() != parentEpoch+1 || res.MessageID != NewMessageID(unhex(t, e.Commit)) {
			t.Fatalf("epoch %d: epoch %d, result %+v", i, st.Epoch(), res)
		}
		if !bytes.Equal(st.EpochAuthenticator(), unhex(t, e.EpochAuthenticator)) {
			t.Fatalf("epoch %d: epoch authenticator mismatch", i)
		}
	}
}

func runPassiveFile(t *testing.T, name string) {
	var vecs []passiveVector
	loadJSON(t, name, &vecs)
	ran := 0
	for i, v := range vecs {
		if !SupportedCipherSuite(v.CipherSuite) {
			continue
		}
		ran++
		t.Run(fmt.Sprintf("vector-%d-suite-%d", i, v.CipherSuite), func(t *testing.T) { runPassive(t, v) })
	}
	if ran == 0 {
		t.Fatal("no vector of a supported cipher suite")
	}
}

func TestPassiveClientWelcomeVectors(t *testing.T) { runPassiveFile(t, "passive-client-welcome.json") }

func TestPassiveClientHandlingCommitVectors(t *testing.T) {
	runPassiveFile(t, "passive-client-handling-commit.json")
}
