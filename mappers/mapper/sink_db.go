package mapper

import (
	"bufio"
	"context"
	"crypto/tls"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Database sinks, in the shapes of KubeEdge's dbMethod: each reading is
// one entry, written in batches (one round trip for up to sinkBatch
// readings), and a reading leaves the buffer only once the server took it.
//
//   - redis: ZADD <namespace>/<device>/<property> <read time, Unix ms>
//     <payload JSON>, on database redisClientConfig.db (KubeEdge's
//     mappers name the set after the device alone).
//   - mysql: a row (ts DATETIME(3) UTC, field TEXT: the twin's value) in
//     the table `<namespace>/<device>/<property>` of
//     mysqlClientConfig.database, made when missing with an id BIGINT
//     AUTO_INCREMENT key (KubeEdge's table, with milliseconds).

// dbAddr checks a dbMethod's host:port.
func dbAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("%q: must be host:port", addr)
	}
	if host == "" {
		return "", fmt.Errorf("%q names no host", addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return "", fmt.Errorf("%q: port must be 1-65535", addr)
	}
	return addr, nil
}

// redisTransport writes readings to Redis over RESP2: per batch, one
// pipelined ZADD a reading, one round trip. The password (and a user name,
// for Redis ACLs) comes from the sink's credentials (AUTH); a ca.crt among
// them turns TLS on. It is Dowse's own because a pipelined ZADD is a few
// lines of Redis's protocol, and go-redis added 1.85 MB to every mapper
// binary, which stays resident (see docs/design/benchmarks.md, Mappers).
type redisTransport struct {
	addr    string
	db      int
	creds   credentialSource
	timeout time.Duration
	conn    net.Conn
	w       *bufio.Writer
	r       *bufio.Reader
}

func (t *redisTransport) connect(ctx context.Context) error {
	c, err := t.creds.load()
	if err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	var conn net.Conn
	if len(c.ca) > 0 {
		tc, err := c.tlsConfig()
		if err != nil {
			return err
		}
		conn, err = (&tls.Dialer{Config: tc}).DialContext(dctx, "tcp", t.addr)
		if err != nil {
			return fmt.Errorf("connecting to redis %s: %w", t.addr, err)
		}
	} else if conn, err = (&net.Dialer{}).DialContext(dctx, "tcp", t.addr); err != nil {
		return fmt.Errorf("connecting to redis %s: %w", t.addr, err)
	}
	t.conn, t.w, t.r = conn, bufio.NewWriterSize(conn, 16<<10), bufio.NewReaderSize(conn, 4<<10)
	var cmds [][]string
	switch {
	case c.username != "":
		cmds = append(cmds, []string{"AUTH", c.username, c.password})
	case c.password != "":
		cmds = append(cmds, []string{"AUTH", c.password})
	}
	if t.db != 0 {
		cmds = append(cmds, []string{"SELECT", strconv.Itoa(t.db)})
	}
	cmds = append(cmds, []string{"PING"})
	_ = conn.SetDeadline(time.Now().Add(t.timeout))
	for _, cmd := range cmds {
		_, _ = t.w.WriteString("*" + strconv.Itoa(len(cmd)) + "\r\n")
		for _, a := range cmd {
			t.bulk(a)
		}
	}
	err = t.w.Flush()
	for i := 0; err == nil && i < len(cmds); i++ {
		var answer error
		if answer, err = t.reply(); err == nil && answer != nil {
			t.close()
			if cmds[i][0] == "PING" {
				return fmt.Errorf("redis %s answered PING: %w", t.addr, answer)
			}
			// AUTH refused, SELECT of a database the server has not:
			// the same login gets the same answer.
			return fmt.Errorf("redis %s %w %s: %w", t.addr, errSinkRefused, strings.ToLower(cmds[i][0]), answer)
		}
	}
	if err != nil {
		t.close()
		return fmt.Errorf("connecting to redis %s: %w", t.addr, err)
	}
	_ = conn.SetDeadline(time.Time{})
	return nil
}

// bulk and bulkBytes write a RESP bulk string (into the buffer: a
// failed write shows at the flush).
func (t *redisTransport) bulk(s string) {
	t.header(len(s))
	_, _ = t.w.WriteString(s)
	_, _ = t.w.WriteString("\r\n")
}

func (t *redisTransport) bulkBytes(b []byte) {
	t.header(len(b))
	_, _ = t.w.Write(b)
	_, _ = t.w.WriteString("\r\n")
}

func (t *redisTransport) header(n int) {
	var num [20]byte
	_ = t.w.WriteByte('$')
	_, _ = t.w.Write(strconv.AppendInt(num[:0], int64(n), 10))
	_, _ = t.w.WriteString("\r\n")
}

// reply reads one RESP2 reply: answer is the server's error reply, err a
// broken or malformed stream.
func (t *redisTransport) reply() (answer, err error) {
	line, err := t.r.ReadSlice('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("malformed reply %q", line)
	}
	body := line[1 : len(line)-2]
	switch line[0] {
	case '+', ':':
		return nil, nil
	case '-':
		return errors.New(string(body)), nil
	case '$':
		n, err := strconv.Atoi(string(body))
		if err != nil {
			return nil, fmt.Errorf("malformed reply %q", line)
		}
		if n >= 0 {
			_, err = t.r.Discard(n + 2)
		}
		return nil, err
	case '*':
		n, err := strconv.Atoi(string(body))
		if err != nil {
			return nil, fmt.Errorf("malformed reply %q", line)
		}
		for range n {
			if a, err := t.reply(); err != nil || a != nil {
				return a, err
			}
		}
		return nil, nil
	}
	return nil, fmt.Errorf("malformed reply %q", line)
}

func (t *redisTransport) deliver(_ context.Context, msgs []*reading) (done, refused int, refusal, err error) {
	_ = t.conn.SetDeadline(time.Now().Add(t.timeout))
	for _, r := range msgs {
		_, _ = t.w.WriteString("*4\r\n$4\r\nZADD\r\n")
		t.bulk(r.topic)
		var score [20]byte
		t.bulkBytes(strconv.AppendInt(score[:0], r.at, 10))
		t.bulkBytes(r.payload)
	}
	if err := t.w.Flush(); err != nil {
		return 0, 0, nil, fmt.Errorf("writing to redis %s: %w", t.addr, err)
	}
	for i := range msgs {
		answer, err := t.reply()
		if err != nil {
			// What follows waits for a reconnect (what the server took
			// meanwhile is added again: ZADD of the same member and score
			// changes nothing).
			return i, refused, refusal, fmt.Errorf("writing to redis %s: %w", t.addr, err)
		}
		if answer != nil {
			// The server's answer to this reading (e.g. WRONGTYPE: the
			// key holds something else): sending it again gets it again.
			refused++
			refusal = fmt.Errorf("redis %s %w the reading for %s: %w", t.addr, errSinkRefused, msgs[i].topic, answer)
		}
	}
	return len(msgs), refused, refusal, nil
}

func (t *redisTransport) close() {
	if t.conn != nil {
		t.conn.Close()
		t.conn, t.w, t.r = nil, nil, nil
	}
}

// mysqlTransport writes readings to MySQL or MariaDB with
// go-sql-driver/mysql: per batch, one multi-row INSERT for each run of
// readings of one table. The user is the sink's credentials' username,
// else mysqlClientConfig.userName.
type mysqlTransport struct {
	addr, database, user string
	creds                credentialSource
	timeout              time.Duration
	db                   *sql.DB
	tables               map[string]bool // made on this connection
	query                strings.Builder
	args                 []any
}

func (t *mysqlTransport) connect(ctx context.Context) error {
	c, err := t.creds.load()
	if err != nil {
		return err
	}
	cfg := mysql.NewConfig()
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", t.addr, t.database
	cfg.User, cfg.Passwd = t.user, c.password
	if c.username != "" {
		cfg.User = c.username
	}
	cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = t.timeout, t.timeout, t.timeout
	cfg.Loc = time.UTC
	if len(c.ca) > 0 {
		tc, err := c.tlsConfig()
		if err != nil {
			return err
		}
		host, _, _ := net.SplitHostPort(t.addr)
		tc.ServerName = host
		cfg.TLS = tc
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return fmt.Errorf("mysql %s: %w", t.addr, err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		var me *mysql.MySQLError
		if errors.As(err, &me) && (me.Number == 1044 || me.Number == 1045 || me.Number == 1049) {
			// Access denied, to the server or the database; no such database.
			return fmt.Errorf("mysql %s %w the login: %w", t.addr, errSinkRefused, err)
		}
		return fmt.Errorf("connecting to mysql %s: %w", t.addr, err)
	}
	t.db, t.tables = db, map[string]bool{}
	return nil
}

// quoteIdent quotes a MySQL identifier.
func quoteIdent(s string) string { return "`" + strings.ReplaceAll(s, "`", "``") + "`" }

func (t *mysqlTransport) deliver(ctx context.Context, msgs []*reading) (done, refused int, refusal, err error) {
	for done < len(msgs) {
		table := msgs[done].topic
		end := done + 1
		for end < len(msgs) && msgs[end].topic == table {
			end++
		}
		err := t.insert(ctx, table, msgs[done:end])
		var me *mysql.MySQLError
		switch {
		case err == nil:
		case errors.As(err, &me):
			// The server's answer to these readings (a table name too
			// long, a value refused): sending them again gets it again.
			refused += end - done
			refusal = fmt.Errorf("mysql %s %w the readings for %s: %w", t.addr, errSinkRefused, table, err)
		default:
			return done, refused, refusal, fmt.Errorf("writing to mysql %s: %w", t.addr, err)
		}
		done = end
	}
	return done, refused, refusal, nil
}

func (t *mysqlTransport) insert(ctx context.Context, table string, msgs []*reading) error {
	if !t.tables[table] {
		if _, err := t.db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+quoteIdent(table)+
			" (id BIGINT AUTO_INCREMENT PRIMARY KEY, ts DATETIME(3) NOT NULL, field TEXT)"); err != nil {
			return err
		}
		t.tables[table] = true
	}
	t.query.Reset()
	t.query.WriteString("INSERT INTO ")
	t.query.WriteString(quoteIdent(table))
	t.query.WriteString(" (ts, field) VALUES ")
	t.args = t.args[:0]
	for i, r := range msgs {
		if i > 0 {
			t.query.WriteByte(',')
		}
		t.query.WriteString("(?,?)")
		t.args = append(t.args, time.UnixMilli(r.at).UTC(), r.value)
	}
	_, err := t.db.ExecContext(ctx, t.query.String(), t.args...)
	clear(t.args)
	return err
}

func (t *mysqlTransport) close() {
	if t.db != nil {
		t.db.Close()
		t.db = nil
	}
}
