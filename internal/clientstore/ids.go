package clientstore

import "github.com/fabric-mls/fabric/internal/clientstore/outbox"

// eventID derives a store event's id from its cause.
func eventID(parts ...string) string { return outbox.ID(parts...) }
