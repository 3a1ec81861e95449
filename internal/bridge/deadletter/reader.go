package deadletter

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
)

// DefaultMaxLine bounds the line the reader holds in memory: an MQTT
// message of up to 256 MiB, base64-encoded (4/3), with room for the rest
// of the record. A longer line is reported as a problem and skipped
// without being held.
const DefaultMaxLine = 360 << 20

// Entry is one record read back, with where it is in the file.
type Entry struct {
	Record
	// Line is its line number (from 1); Offset the byte offset of the
	// line's start.
	Line   int
	Offset int64
}

// Problem is a line the reader could not use.
type Problem struct {
	Line   int
	Offset int64
	// Torn is set for a last line without its newline that does not
	// decode: a write a crash cut short. Its message was not acknowledged
	// as dead-lettered, so the bridge delivered it again or will.
	Torn bool
	Err  error
}

func (p Problem) Error() string {
	if p.Torn {
		return fmt.Sprintf("line %d (offset %d): torn last line, ignored: %v", p.Line, p.Offset, p.Err)
	}
	return fmt.Sprintf("line %d (offset %d): corrupt, skipped: %v", p.Line, p.Offset, p.Err)
}

// Scan reads the lines of r in order and calls fn with each record; it
// returns the lines it could not decode, or the first error of r or fn.
// Blank lines are skipped. maxLine <= 0 is DefaultMaxLine.
func Scan(r io.Reader, maxLine int, fn func(Entry) error) ([]Problem, error) {
	return scanLines(r, maxLine, func(line []byte, n int, off int64, last bool) (*Problem, error) {
		rec, err := Decode(line)
		if err != nil {
			return &Problem{Line: n, Offset: off, Torn: last, Err: err}, nil
		}
		return nil, fn(Entry{Record: rec, Line: n, Offset: off})
	})
}

// ReadFile reads every record of the file at path (see Scan).
func ReadFile(path string, maxLine int) ([]Entry, []Problem, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	var out []Entry
	problems, err := Scan(f, maxLine, func(e Entry) error {
		out = append(out, e)
		return nil
	})
	return out, problems, err
}

// errTooLong is the problem of a line above the limit.
var errTooLong = errors.New("line too long")

// scanLines calls fn with every non-blank line of r (without its
// newline), its number and offset, and whether it is a last line without
// a newline. A line longer than maxLine is a Problem, skipped without
// being held in memory.
func scanLines(r io.Reader, maxLine int, fn func(line []byte, n int, off int64, last bool) (*Problem, error)) ([]Problem, error) {
	if maxLine <= 0 {
		maxLine = DefaultMaxLine
	}
	br := bufio.NewReaderSize(r, 64<<10)
	var problems []Problem
	var off int64
	var buf []byte
	for n := 1; ; n++ {
		buf = buf[:0]
		size, tooLong, eof := 0, false, false
		for {
			chunk, err := br.ReadSlice('\n')
			size += len(chunk)
			if !tooLong {
				if len(buf)+len(chunk) > maxLine+1 { // +1: the newline
					tooLong, buf = true, buf[:0]
				} else {
					buf = append(buf, chunk...)
				}
			}
			if err == nil {
				break
			}
			if errors.Is(err, bufio.ErrBufferFull) {
				continue
			}
			if errors.Is(err, io.EOF) {
				eof = true
				break
			}
			return problems, err
		}
		if size == 0 && eof {
			return problems, nil
		}
		last := eof // the line has no newline
		start := off
		off += int64(size)
		switch {
		case tooLong:
			problems = append(problems, Problem{Line: n, Offset: start, Torn: last,
				Err: fmt.Errorf("%w: %d bytes, above the limit of %d", errTooLong, size, maxLine)})
		default:
			line := bytes.TrimSuffix(buf, []byte{'\n'})
			if len(bytes.TrimSpace(line)) == 0 {
				break
			}
			p, err := fn(line, n, start, last)
			if p != nil {
				problems = append(problems, *p)
			}
			if err != nil {
				return problems, err
			}
		}
		if eof {
			return problems, nil
		}
	}
}
