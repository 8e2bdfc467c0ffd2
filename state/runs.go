package state

import (
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
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
// second one within the same second gets a numeric suffix above every
// suffix that second already has, so nothing is ever overwritten and a
// newer directory never sorts before an older one (timestampLess), even
// after KeepNewest removed the second's first directory.
func NewTimestampDir(parent string, now time.Time) (string, error) {
	base := now.UTC().Format(TimestampLayout)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return "", err
	}
	next := 0
	if entries, err := os.ReadDir(parent); err == nil {
		for _, e := range entries {
			if b, n := splitSuffix(e.Name()); b == base {
				next = max(next, n+1)
			}
		}
	}
	for i := next; ; i++ {
		name := base
		if i > 0 {
			name += "-" + strconv.Itoa(i)
		}
		path := filepath.Join(parent, name)
		err := os.Mkdir(path, 0o700)
		if err == nil {
			return path, nil
		}
		if !os.IsExist(err) || i > next+100 {
			return "", err
		}
	}
}

// splitSuffix splits a NewTimestampDir name into its timestamp and its
// same-second suffix (0 for none).
func splitSuffix(name string) (string, int) {
	if i := strings.LastIndexByte(name, '-'); i > 0 {
		if n, err := strconv.Atoi(name[i+1:]); err == nil && n > 0 {
			return name[:i], n
		}
	}
	return name, 0
}

// timestampLess orders NewTimestampDir names by time, then by suffix as a
// number ("-10" after "-9").
func timestampLess(a, b string) bool {
	ab, an := splitSuffix(a)
	bb, bn := splitSuffix(b)
	if ab != bb {
		return ab < bb
	}
	return an < bn
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
		// Only the timestamped directories count: a file beside them
		// (the postcheck's index.html) is not an archive.
		if e.Name()[0] != '.' && e.IsDir() {
			names = append(names, e.Name())
		}
	}
	sort.Slice(names, func(i, j int) bool { return timestampLess(names[i], names[j]) })
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
