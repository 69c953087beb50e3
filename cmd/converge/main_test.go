package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParsePartitions(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []int
		bad  bool
	}{
		{in: "all"},
		{in: ""},
		{in: "3", want: []int{3}},
		{in: "0-2,63", want: []int{0, 1, 2, 63}},
		{in: "64", bad: true},
		{in: "5-2", bad: true},
		{in: "x", bad: true},
		{in: "1-y", bad: true},
		{in: "-1", bad: true},
	} {
		got, err := parsePartitions(c.in)
		if (err != nil) != c.bad || !slices.Equal(got, c.want) {
			t.Errorf("parsePartitions(%q) = %v, %v", c.in, got, err)
		}
	}
}

// TestConfigErrors: a start without a master key or with bad partitions
// stops with a message naming the setting.
func TestConfigErrors(t *testing.T) {
	t.Setenv("FABRIC_MASTER_KEY", "")
	if _, _, err := parse([]string{"-partitions", "99"}); err == nil {
		t.Fatal("accepted a bad configuration")
	}
	t.Setenv("FABRIC_MASTER_KEY", "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff")
	o, key, err := parse([]string{"-worker-id", "w1", "-partitions", "0-7"})
	if err != nil || len(key) != 32 || o.workerID != "w1" || o.keyPackagePool != 1 {
		t.Fatalf("parse: %v", err)
	}
	for _, bad := range [][]string{{"-key-package-pool", "0"}, {"-key-package-pool", "101"}, {"-self-update-after", "30s"}, {"-self-update-after", "-1h"}, {"-idle-after", "0s"}} {
		if _, _, err := parse(bad); err == nil || !strings.Contains(err.Error(), bad[0]) {
			t.Fatalf("%s %s: %v", bad[0], bad[1], err)
		}
	}
	if o, _, err := parse([]string{"-self-update-after", "168h"}); err != nil || o.selfUpdate != 7*24*time.Hour {
		t.Fatalf("-self-update-after 168h: %v", err)
	}
	if o.idleAfter != time.Minute {
		t.Fatalf("-idle-after default %v", o.idleAfter)
	}
}

// TestLinearHistoryRemoved: the linear mode is gone. It could not give the
// inbound spec's dispositions (an application message inside the
// app-payload window is delivered, not stale_epoch; one for a future epoch
// is deferred without missing_history; a deferred input is never relabelled
// stale), so a start that asks for it stops instead of running it.
func TestLinearHistoryRemoved(t *testing.T) {
	t.Setenv("FABRIC_MASTER_KEY", "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff")
	if _, _, err := parse([]string{"-linear-history"}); err == nil {
		t.Fatal("-linear-history accepted")
	}
}
