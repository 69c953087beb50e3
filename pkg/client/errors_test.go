package client

import (
	"errors"
	"testing"
)

func TestEndedErrorMatchesErrEnded_EVENT053(t *testing.T) {
	cause := &GatewayError{Code: "forbidden", Message: "token does not name this client"}
	err := error(&EndedError{Reason: "resume refused", Err: cause})
	if !errors.Is(err, ErrEnded) {
		t.Fatal("EndedError does not match ErrEnded")
	}
	var ge *GatewayError
	if !errors.As(err, &ge) || ge.Code != "forbidden" {
		t.Fatal("the cause is not reachable")
	}
	if errors.Is(&EndedError{Reason: "closed"}, ErrClosed) {
		t.Fatal("an end without a cause matched ErrClosed")
	}
}
