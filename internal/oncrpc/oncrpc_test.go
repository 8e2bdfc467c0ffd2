package oncrpc

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// TestAnotherServiceOnThePort: what answers a call with HTTP instead of an
// RPC record is named by what it sent, not read as a 1.2 GB record.
func TestAnotherServiceOnThePort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 512)
		_, _ = c.Read(buf)
		_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := Dial(ctx, l.Addr().String(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = conn.Call(ctx, 100000, 2, 3, nil)
	if err == nil || !strings.Contains(err.Error(), `not ONC RPC: it starts with "HTTP"`) {
		t.Fatalf("Call against an HTTP server: %v, want it named", err)
	}
}
