// Package targz packs files into a gzipped tarball deterministically: the
// same files give the same bytes.
package targz

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"os"
	"sort"
	"time"
)

// Pack returns files (path in the archive → content) as a tar.gz with the
// entries sorted by name, all with mode and modTime.
func Pack(files map[string][]byte, mode os.FileMode, modTime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		hdr := &tar.Header{Name: n, Mode: int64(mode.Perm()), Size: int64(len(files[n])), ModTime: modTime.UTC(), Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(files[n]); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
