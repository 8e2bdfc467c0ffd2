package nfs_test

import (
	"os"
	"strconv"
	"syscall"
)

func ownerOf(st os.FileInfo) string {
	if st == nil {
		return ""
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return strconv.Itoa(int(sys.Uid))
	}
	return ""
}
