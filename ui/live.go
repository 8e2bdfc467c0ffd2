package ui

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
	"unicode/utf8"

	"github.com/rs/zerolog"
	"golang.org/x/term"

	"github.com/homelab/bootstrap/internal/wait"
)

// liveConsole renders events for a person. Ordinary events become console
// lines. Live events (wait.FieldLive) do not: on a terminal each running
// wait owns one line at the bottom that its events overwrite ("nodes
// configured: 2/3 done, pending: cp-3 (41s elapsed)") and that goes away
// when the wait ends; elsewhere the info-level ones print as lines and the
// trace-level ticks are dropped.
type liveConsole struct {
	out     io.Writer
	console zerolog.ConsoleWriter // renders into buf
	buf     *bytes.Buffer
	min     zerolog.Level
	tty     bool
	width   func() int

	mu    sync.Mutex
	order []string          // running waits, oldest first
	lines map[string]string // their current text
	shown int               // region lines on screen now
}

// newLiveConsole writes to out; tty is the terminal behind it (for its
// width), when it is one.
func newLiveConsole(out, tty io.Writer, min zerolog.Level, isTTY, noColor bool) *liveConsole {
	buf := &bytes.Buffer{}
	c := &liveConsole{out: out, buf: buf, min: min, tty: isTTY, console: consoleWriter(buf, noColor), lines: map[string]string{}}
	c.width = func() int { return 100 }
	if f, ok := tty.(*os.File); ok && isTTY {
		c.width = func() int {
			if w, _, err := term.GetSize(int(f.Fd())); err == nil && w > 10 {
				return w
			}
			return 100
		}
	}
	return c
}

func (c *liveConsole) Write(p []byte) (int, error) { return c.WriteLevel(zerolog.NoLevel, p) }

// WriteLevel implements zerolog.LevelWriter.
func (c *liveConsole) WriteLevel(l zerolog.Level, p []byte) (int, error) {
	var ev struct {
		Live     string `json:"live"`
		LiveEnd  bool   `json:"live_end"`
		StageEnd bool   `json:"stage_end"`
		Message  string `json:"message"`
		UI       string `json:"ui"`
	}
	// Only live events and stage boundaries need a look inside.
	if bytes.Contains(p, []byte(`"`+wait.FieldLive+`"`)) || bytes.Contains(p, []byte(`"`+FieldUI+`":"`+kindHeader+`"`)) || bytes.Contains(p, []byte(`"`+FieldStageEnd+`"`)) {
		_ = json.Unmarshal(p, &ev)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if ev.Live != "" && c.tty {
		if ev.LiveEnd {
			c.drop(ev.Live)
		} else if ev.Message != "" {
			if _, ok := c.lines[ev.Live]; !ok {
				c.order = append(c.order, ev.Live)
			}
			c.lines[ev.Live] = "◎ " + ev.Message
		}
		return len(p), c.redraw(nil)
	}
	if l < c.min || (ev.Live != "" && (ev.LiveEnd || l < zerolog.InfoLevel)) {
		return len(p), nil
	}
	if ev.UI == kindHeader || ev.StageEnd {
		// A stage starts or ends: whatever it waited for is over.
		c.order, c.lines = nil, map[string]string{}
	}
	c.buf.Reset()
	if _, err := c.console.Write(p); err != nil {
		return 0, err
	}
	if !c.tty {
		_, err := c.out.Write(c.buf.Bytes())
		return len(p), err
	}
	return len(p), c.redraw(c.buf.Bytes())
}

func (c *liveConsole) drop(key string) {
	delete(c.lines, key)
	for i, k := range c.order {
		if k == key {
			c.order = append(c.order[:i], c.order[i+1:]...)
			break
		}
	}
}

// redraw erases the live region, prints line (an ordinary event, may be
// nil) above it and draws the region again, in one write.
func (c *liveConsole) redraw(line []byte) error {
	var b bytes.Buffer
	if c.shown > 0 {
		fmt.Fprintf(&b, "\x1b[%dA\x1b[J", c.shown) // up to the region's top, clear below
	}
	b.Write(line)
	width := c.width()
	for _, k := range c.order {
		b.WriteString(truncate(c.lines[k], width-1))
		b.WriteString("\n")
	}
	c.shown = len(c.order)
	_, err := c.out.Write(b.Bytes())
	return err
}

// truncate keeps a live line on one terminal row: a wrapped line would throw
// off the count of rows to erase.
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:max(n-1, 0)]) + "…"
}
