package signals

import (
	"github.com/fabric-mls/fabric/internal/refusal"
	"github.com/fabric-mls/fabric/pkg/schema"
)

// route says how a signal kind is ordered and stored.
type route int

const (
	// routeGroup: message.* signals, ordered per group (EVENT-012).
	routeGroup route = iota + 1
	// routeAttachment: attachment.* signals, ordered per attachment key
	// (EVENT-057).
	routeAttachment
	// routeClient: client-wide signals, ordered per client.
	routeClient
	// routeLockout: client.lockout_changed, kept per credential handle and
	// delivered to every client sharing it (EVENT-055).
	routeLockout
)

// signalKinds are the local-change kinds a tenant's runtime reports
// (DESIGN §6), with their routes.
var signalKinds = map[schema.EventKind]route{
	schema.KindMessageStatusChanged:        routeGroup,
	schema.KindMessageDeleted:              routeGroup,
	schema.KindRejectedByServer:            routeClient,
	schema.KindLockoutChanged:              routeLockout,
	schema.KindNotificationsFailed:         routeClient,
	schema.KindArchiveRestored:             routeClient,
	schema.KindAttachmentUploadStarted:     routeAttachment,
	schema.KindAttachmentUploadCompleted:   routeAttachment,
	schema.KindAttachmentUploadFailed:      routeAttachment,
	schema.KindAttachmentDownloadStarted:   routeAttachment,
	schema.KindAttachmentDownloadCompleted: routeAttachment,
	schema.KindAttachmentDownloadFailed:    routeAttachment,
	schema.KindAttachmentDeleted:           routeAttachment,
}

// storeKinds are emitted by the fabric's own client stores.
var storeKinds = map[schema.EventKind]bool{
	schema.KindConsentChanged:         true,
	schema.KindHmacKeysUpdated:        true,
	schema.KindIdentityRegistered:     true,
	schema.KindOwnInstallationAdded:   true,
	schema.KindOwnInstallationRevoked: true,
	schema.KindHandleChanged:          true,
}

// refuseKind says why ev is not a signal the runtime may report, or nil
// when it is. ev has passed Validate.
func refuseKind(ev schema.ClientEvent) *refusal.Error {
	k := ev.Kind
	if _, ok := signalKinds[k]; ok {
		// EVENT-007: deletion by a commit is convergence's to report.
		if k == schema.KindMessageDeleted && ev.MessageDeleted.Cause != schema.DeletionDeletedLocally {
			return notSignal("message.deleted with cause %q is emitted by convergence; a signal reports cause deleted_locally only", ev.MessageDeleted.Cause)
		}
		return nil
	}
	switch {
	case k == schema.KindLagged:
		return notSignal("lagged is made by the gateway for a subscription, not reported")
	case k == schema.KindConnectionStateChanged:
		// EVENT-027: the state is the fabric's to compute over the streams.
		return notSignal("connection.state_changed is computed by the fabric over the client's streams; report each stream's state with POST …/connection")
	case storeKinds[k]:
		return notSignal("%s is emitted by the fabric's client stores; use the client store endpoints", k)
	}
	return notSignal("%s is emitted by convergence, not reported by a runtime", k)
}

func notSignal(format string, args ...any) *refusal.Error {
	return ErrKindNotSignal.With(format, args...)
}
