package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/internal/fsutil"
	"github.com/homelab/bootstrap/internal/proc"
)

// StateFileName records a running lab in its directory.
const StateFileName = "lab.json"

// Record is what `lab status` and `lab down` read about a running lab.
type Record struct {
	PID       int       `json:"pid"`
	Config    string    `json:"config"`
	Started   time.Time `json:"started"`
	Profile   string    `json:"profile"`
	TimeScale float64   `json:"time_scale"`
	Subnet    string    `json:"subnet"`
	Proxmox   string    `json:"proxmox"`
	NFS       string    `json:"nfs"`
	Charts    string    `json:"charts"`
	Flux      string    `json:"flux_manifests"`
	Nodes     int       `json:"nodes"`
}

// Record describes the running lab for its state file.
func (l *Lab) Record() Record {
	return Record{PID: os.Getpid(), Config: abs(l.configPath), Started: time.Now().UTC(), Profile: l.opts.Profile, TimeScale: l.opts.TimeScale,
		Subnet: l.prefix.String(), Proxmox: l.PVE.APIURL(), NFS: l.NFS.Addr() + l.NFS.ExportPath(), Charts: l.Charts.URL(),
		Flux: l.Manifest.URL(), Nodes: l.opts.ControlPlanes + l.opts.Workers}
}

// WriteRecord stores rec in dir atomically.
func WriteRecord(dir string, rec Record) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return fsutil.WriteAtomic(filepath.Join(dir, StateFileName), append(b, '\n'), 0o644)
}

// ErrNotRunning says no lab is recorded in the directory.
var ErrNotRunning = errors.New("no lab is running there")

// ReadRecord loads the record of the lab in dir and whether its process
// is alive.
func ReadRecord(dir string) (*Record, bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, StateFileName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, ErrNotRunning
	}
	if err != nil {
		return nil, false, err
	}
	var rec Record
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, false, fmt.Errorf("%s: %w", StateFileName, err)
	}
	return &rec, alive(rec.PID), nil
}

// RemoveRecord deletes the state file.
func RemoveRecord(dir string) error {
	err := os.Remove(filepath.Join(dir, StateFileName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// isLab tells a `bootstrap-lab up` process by its command line: a recorded
// pid reused by something else is not our lab.
var isLab = proc.HasSubcommand("up")

func alive(pid int) bool { return proc.Alive(pid, isLab) }

// StopProcess sends SIGTERM to the lab process and waits up to grace for
// it to exit, then SIGKILLs it. It reports whether a process was stopped.
func StopProcess(ctx context.Context, pid int, grace time.Duration) (bool, error) {
	return proc.Stop(ctx, pid, "lab", isLab, grace, zerolog.Nop())
}
