// Package state keeps the run history of one cluster in
// ai/state/<cluster>/state.json: per-stage status for resume and `bootstrap
// status`, plus the typed outputs later stages need (VMIDs, node IPs, paths).
// It is history and resume hints; stages check live state before acting.
package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/homelab/bootstrap/internal/fsutil"
)

// SchemaVersion is the version of the state.json layout this build writes.
const SchemaVersion = 1

// FileName is the state file inside a cluster's state directory.
const FileName = "state.json"

// Status is the last known outcome of a stage.
type Status string

// Stage statuses. Running is written when a stage starts; finding it on load
// means the process died mid-stage (kill -9, power loss), which resume and
// status treat as interrupted.
const (
	Never       Status = "never"
	Running     Status = "running"
	OK          Status = "ok"
	Failed      Status = "failed"
	Interrupted Status = "interrupted"
)

// StageRecord is the history of one stage.
type StageRecord struct {
	Status   Status    `json:"status"`
	Started  time.Time `json:"started,omitzero"`
	Finished time.Time `json:"finished,omitzero"`
	// DurationSeconds of the last attempt.
	DurationSeconds float64 `json:"duration_seconds,omitempty"`
	// Attempts counts every start of this stage, successful or not.
	Attempts int `json:"attempts"`
	// Error is the last failure's text (already redacted).
	Error string `json:"error,omitempty"`
	// Changes lists what the last attempt changed ("created VM 701 cp-1").
	Changes []string `json:"changes,omitempty"`
}

// EffectiveStatus maps a Running record left by a dead process to Interrupted.
func (r *StageRecord) EffectiveStatus() Status {
	if r == nil {
		return Never
	}
	if r.Status == Running {
		return Interrupted
	}
	return r.Status
}

// Run describes the last invocation of `bootstrap run`.
type Run struct {
	ID       string    `json:"id"`
	Command  string    `json:"command"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished,omitzero"`
	Stages   []string  `json:"stages"`
	ExitCode int       `json:"exit_code"`
	LogPath  string    `json:"log_path,omitempty"`
}

// State is the content of state.json.
type State struct {
	SchemaVersion int                     `json:"schema_version"`
	Cluster       string                  `json:"cluster"`
	Updated       time.Time               `json:"updated,omitzero"`
	Stages        map[string]*StageRecord `json:"stages"`
	LastRun       *Run                    `json:"last_run,omitempty"`
	Outputs       Outputs                 `json:"outputs"`
}

// New returns an empty state for cluster.
func New(cluster string) *State {
	return &State{SchemaVersion: SchemaVersion, Cluster: cluster, Stages: map[string]*StageRecord{}}
}

// Stage returns the record for name, creating it if needed.
func (s *State) Stage(name string) *StageRecord {
	if s.Stages == nil {
		s.Stages = map[string]*StageRecord{}
	}
	r, ok := s.Stages[name]
	if !ok {
		r = &StageRecord{Status: Never}
		s.Stages[name] = r
	}
	return r
}

// Load reads dir/state.json. A missing file yields an empty state for
// cluster; a file from a newer schema is refused rather than misread.
func Load(dir, cluster string) (*State, error) {
	path := filepath.Join(dir, FileName)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return New(cluster), nil
	}
	if err != nil {
		return nil, err
	}
	s := New(cluster)
	if err := json.Unmarshal(b, s); err != nil {
		return nil, fmt.Errorf("reading %s: %w (move it aside to start fresh; live state is re-checked anyway)", path, err)
	}
	if s.SchemaVersion > SchemaVersion {
		return nil, fmt.Errorf("%s has schema version %d, this bootstrap understands up to %d: upgrade bootstrap", path, s.SchemaVersion, SchemaVersion)
	}
	if s.Cluster != "" && s.Cluster != cluster {
		return nil, fmt.Errorf("%s belongs to cluster %q, not %q", path, s.Cluster, cluster)
	}
	s.Cluster = cluster
	s.SchemaVersion = SchemaVersion
	if s.Stages == nil {
		s.Stages = map[string]*StageRecord{}
	}
	return s, nil
}

// Save writes the state atomically to dir/state.json (temp file, fsync, rename).
func (s *State) Save(dir string, now time.Time) error {
	s.SchemaVersion = SchemaVersion
	s.Updated = now.UTC()
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return fsutil.WriteAtomic(filepath.Join(dir, FileName), append(b, '\n'), 0o600)
}
