package pvesim

import (
	"fmt"
	"time"
)

// Profile is the latency model of a simulated host: how long API calls and
// tasks take. Every duration is multiplied by Options.TimeScale.
type Profile struct {
	// Name identifies the profile ("instant", "n100").
	Name string
	// Request is added to every API call before it is answered.
	Request time.Duration
	// ConfigUpdate is the extra time a synchronous config change takes.
	ConfigUpdate time.Duration
	// Create is how long a qmcreate task runs.
	Create time.Duration
	// Start is how long a qmstart task runs before the VM is running.
	Start time.Duration
	// Stop is how long a qmstop task runs.
	Stop time.Duration
	// Shutdown is how long a clean guest shutdown takes.
	Shutdown time.Duration
	// Reboot is how long a qmreboot task runs.
	Reboot time.Duration
	// Delete is how long a qmdestroy task runs.
	Delete time.Duration
	// Resize is how long a disk resize task runs.
	Resize time.Duration
	// DownloadPerMiB is the download-url task time per MiB of the file.
	DownloadPerMiB time.Duration
	// ImportPerMiB is a create task's time per MiB of a disk imported with
	// import-from (qemu-img convert of the image's virtual size onto the
	// disk storage), on top of Create.
	ImportPerMiB time.Duration
	// AuthFailure is how long an unauthenticated call is held before its
	// 401 answer (PVE delays them by 3 s).
	AuthFailure time.Duration
	// LockTimeout is how long an operation waits for the per-VM config lock
	// before failing with "can't lock file ... got timeout".
	LockTimeout time.Duration
	// RRDInterval is how often pvestatd broadcasts guest status (10 s in
	// PVE/Service/pvestatd.pm, $updatetime): /cluster/resources takes a
	// guest's name, status and usage from that data, so a new guest shows
	// no name and status "unknown", and a started one its old status,
	// until the next broadcast. Zero shows live values.
	RRDInterval time.Duration
	// HAStop is how long after a 'hastop' task (which only queues the
	// stop) the HA stack stops the VM: the CRM's next round, then the
	// node's LRM (pve-ha-manager src/PVE/HA/Manager.pm; its timing is
	// unverified: ~10 s taken for one CRM round).
	HAStop time.Duration
	// TicketLifetime is how long a login ticket is valid (2 h:
	// $ticket_lifetime in pve-access-control src/PVE/AccessControl.pm).
	TicketLifetime time.Duration
}

// Instant answers everything at once; only lock waits keep a bound.
func Instant() Profile {
	// HAStop stays above zero: the VM must still run when the hastop
	// task has ended, as it does on PVE.
	return Profile{Name: "instant", LockTimeout: 2 * time.Second, HAStop: 300 * time.Millisecond, TicketLifetime: 2 * time.Hour}
}

// N100 approximates a small Intel N100 host with an NVMe disk and a
// 200 Mbit/s uplink, as measured against PVE 8.
func N100() Profile {
	return Profile{
		Name:           "n100",
		Request:        15 * time.Millisecond,
		ConfigUpdate:   80 * time.Millisecond,
		Create:         3 * time.Second,
		Start:          1500 * time.Millisecond,
		Stop:           1 * time.Second,
		Shutdown:       6 * time.Second,
		Reboot:         3 * time.Second,
		Delete:         2 * time.Second,
		Resize:         700 * time.Millisecond,
		DownloadPerMiB: 40 * time.Millisecond,
		// An estimate, not a measurement: qemu-img convert of the 4247 MiB
		// nocloud image of Talos 1.13 (mostly unallocated clusters, written
		// as zeroes onto a thin volume) at about 400 MiB/s on the N100's
		// NVMe: 10.6 s.
		ImportPerMiB:   2500 * time.Microsecond,
		AuthFailure:    3 * time.Second,
		LockTimeout:    10 * time.Second,
		RRDInterval:    10 * time.Second,
		HAStop:         10 * time.Second,
		TicketLifetime: 2 * time.Hour,
	}
}

// ProfileByName returns the named profile ("instant" or "n100").
func ProfileByName(name string) (Profile, error) {
	switch name {
	case "", "instant":
		return Instant(), nil
	case "n100":
		return N100(), nil
	}
	return Profile{}, fmt.Errorf("unknown latency profile %q (known: instant, n100)", name)
}
