package state

import (
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"
)

// RunsDirName holds one directory per run with its full JSON log.
const RunsDirName = "runs"

// TimestampLayout names run and archive directories; it sorts in time order.
const TimestampLayout = "20060102T150405Z"

// NewRunDir creates runs/<UTC-timestamp>/ under dir and returns its path.
func NewRunDir(dir string, now time.Time) (string, error) {
	return NewTimestampDir(filepath.Join(dir, RunsDirName), now)
}

// NewTimestampDir creates parent/<UTC-timestamp>/ and returns its path; a
// second one within the same second gets a numeric suffix, so nothing is
// ever overwritten.
func NewTimestampDir(parent string, now time.Time) (string, error) {
	base := filepath.Join(parent, now.UTC().Format(TimestampLayout))
	path := base
	for i := 1; ; i++ {
		err := os.MkdirAll(filepath.Dir(path), 0o700)
		if err == nil {
			err = os.Mkdir(path, 0o700)
		}
		if err == nil {
			return path, nil
		}
		if !os.IsExist(err) || i > 100 {
			return "", err
		}
		path = base + "-" + strconv.Itoa(i)
	}
}

// KeepNewest removes all but the newest keep entries of parent whose names
// sort by time (run and archive directories). keep < 1 keeps everything.
// It returns the removed paths.
func KeepNewest(parent string, keep int) ([]string, error) {
	if keep < 1 {
		return nil, nil
	}
	entries, err := os.ReadDir(parent)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if e.Name()[0] != '.' {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	var removed []string
	for len(names) > keep {
		p := filepath.Join(parent, names[0])
		if err := os.RemoveAll(p); err != nil {
			return removed, err
		}
		removed = append(removed, p)
		names = names[1:]
	}
	return removed, nil
}
