package io.twopc.flink;

import org.apache.flink.annotation.Internal;
import org.apache.flink.annotation.PublicEvolving;

import java.io.Serializable;
import java.io.UnsupportedEncodingException;
import java.net.URI;
import java.net.URISyntaxException;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashSet;
import java.util.List;
import java.util.Locale;
import java.util.Set;

/**
 * Where a {@link TwopcSink} writes when the destination is a PostgreSQL table: the server, the
 * table and its columns, and the {@link PostgresMode}. Pass it to {@link
 * TwopcSinkBuilder#forPostgres(PostgresDestination)}:
 *
 * <pre>{@code
 * TwopcSink<Order> sink = TwopcSink.<Order>forPostgres(
 *                 PostgresDestination.url("postgres://app@db.example:5432/shop")
 *                         .passwordFromEnvironment("SHOP_DB_PASSWORD")
 *                         .table("public.orders")
 *                         .columns("id", "customer", "amount"))
 *         .setSinkId("orders")
 *         .setSerializationSchema(CsvRowSchema.of((Order o) -> new Object[] {o.id, o.customer, o.amount}))
 *         .build();
 * }</pre>
 *
 * <p>Each record is one COPY row of the listed columns ({@link PostgresCopyFormat#CSV} by default,
 * as {@link CsvRowSchema} writes it). Each subtask connects on its own (two sessions: one writes,
 * one commits) and checks the server and the table before the first record, so a setting that
 * cannot work stops the job at start with what to change.
 *
 * <p>The password is never part of this object: it names an environment variable or a JVM system
 * property that each task manager reads when the sink opens, so the password is neither shipped
 * inside the job graph nor printed by {@link #toString()} (the one exception is the SQL connector's
 * {@code 'password'} option, see {@link #passwordFromTableOption(String)}). A connection string carrying a password
 * is refused by {@link TwopcSinkBuilder#build()} for the same reason, in every form: {@code
 * user:password@} (read, as the PostgreSQL client reads it, as everything between {@code ://} and
 * the first {@code @}, even past a {@code /}, {@code ?} or {@code #}), a {@code password}
 * parameter of the query, or a {@code password} keyword of the key=value form. The native side
 * applies the same rules when the sink opens.
 *
 * <p>Instances are immutable: every setter returns a changed copy. Names are used exactly as
 * written (case-sensitive, no folding to lower case).
 */
@PublicEvolving
public final class PostgresDestination implements Serializable {
    private static final long serialVersionUID = 1L;

    public static final Duration DEFAULT_CONNECT_TIMEOUT = Duration.ofSeconds(10);
    public static final String DEFAULT_CONTROL_SCHEMA = "public";
    /** PostgreSQL truncates longer names (NAMEDATALEN - 1 bytes), which would name another object. */
    static final int MAX_NAME_BYTES = 63;
    /** The URL schemes PostgreSQL's client accepts (it compares them exactly). */
    private static final String[] SCHEMES = {"postgresql://", "postgres://"};
    private static final String GIVE_IT_SEPARATELY = "remove it, and give the password with "
            + "passwordFromEnvironment(\"VARIABLE\") or passwordFromSystemProperty(\"property\"), which each "
            + "task manager reads when the sink opens: a password in the connection string would travel inside "
            + "the job graph and show in logs";
    private static final String USERINFO = "in user:password@, the text between :// and the first @, which "
            + "PostgreSQL's client reads as user and password";

    private String url;
    private String host;
    private int port;
    private String database;
    private String user;
    private String passwordEnvironmentVariable;
    private String passwordSystemProperty;
    /** Only from the SQL connector's 'password' option; never shown. */
    private String passwordFromOption;
    private String table;
    private List<String> columns = Collections.emptyList();
    private PostgresMode mode = PostgresMode.TRANSACTIONAL;
    private List<String> keyColumns = Collections.emptyList();
    private boolean operationField;
    /** The SQL connector's declared column types (see {@link #withDeclaredColumnTypes}); empty otherwise. */
    private List<String> declaredColumnTypes = Collections.emptyList();
    private PostgresCopyFormat copyFormat = PostgresCopyFormat.CSV;
    private String transactionIdColumn;
    private String controlSchema = DEFAULT_CONTROL_SCHEMA;
    private Duration connectTimeout = DEFAULT_CONNECT_TIMEOUT;

    private PostgresDestination() {}

    /**
     * The server as a libpq-style URL without password, {@code postgres://user@host:port/database}
     * (or {@code host=... port=... dbname=... user=...}); TLS is not supported. A password here is
     * refused by {@code build()}: use {@link #passwordFromEnvironment(String)} or {@link
     * #passwordFromSystemProperty(String)}.
     */
    public static PostgresDestination url(String url) {
        PostgresDestination d = new PostgresDestination();
        d.url = url;
        return d;
    }

    /** The server by its parts. */
    public static PostgresDestination host(String host, int port, String database, String user) {
        PostgresDestination d = new PostgresDestination();
        d.host = host;
        d.port = port;
        d.database = database;
        d.user = user;
        return d;
    }

    /** The password is the value of environment variable {@code variable} on each task manager. */
    public PostgresDestination passwordFromEnvironment(String variable) {
        PostgresDestination d = copy();
        d.passwordEnvironmentVariable = variable;
        d.passwordSystemProperty = null;
        d.passwordFromOption = null;
        return d;
    }

    /** The password is the value of JVM system property {@code property} on each task manager. */
    public PostgresDestination passwordFromSystemProperty(String property) {
        PostgresDestination d = copy();
        d.passwordSystemProperty = property;
        d.passwordEnvironmentVariable = null;
        d.passwordFromOption = null;
        return d;
    }

    /**
     * The password itself, as the SQL connector's {@code 'password'} option gives it (an option
     * Flink masks in logs and the web UI). Unlike the other two sources it travels inside the job
     * graph with the sink, as the password of Flink's JDBC connector does; it is never shown by
     * {@link #toString()}, in messages or in the configuration the native side reads (which says
     * only {@code option:password}). For the SQL connector only: DataStream jobs use {@link
     * #passwordFromEnvironment(String)} or {@link #passwordFromSystemProperty(String)}.
     */
    @Internal
    public PostgresDestination passwordFromTableOption(String password) {
        PostgresDestination d = copy();
        d.passwordFromOption = password;
        d.passwordEnvironmentVariable = null;
        d.passwordSystemProperty = null;
        return d;
    }

    /** The target table, {@code table} or {@code schema.table}. It must exist. Required. */
    public PostgresDestination table(String table) {
        PostgresDestination d = copy();
        d.table = table;
        return d;
    }

    /** The target columns, in the order each record's values come. Required. */
    public PostgresDestination columns(String... columns) {
        PostgresDestination d = copy();
        d.columns = columns == null ? null : Collections.unmodifiableList(new ArrayList<>(Arrays.asList(columns)));
        return d;
    }

    /** {@link PostgresMode#TRANSACTIONAL}: prepared transactions, rows visible at checkpoints (the default). */
    public PostgresDestination transactional() {
        PostgresDestination d = copy();
        d.mode = PostgresMode.TRANSACTIONAL;
        d.keyColumns = Collections.emptyList();
        return d;
    }

    /**
     * {@link PostgresMode#IDEMPOTENT}: upserts on {@code keyColumns}, which must be listed in
     * {@link #columns(String...)} and be exactly the columns of a primary key or unique index.
     */
    public PostgresDestination idempotent(String... keyColumns) {
        PostgresDestination d = copy();
        d.mode = PostgresMode.IDEMPOTENT;
        d.keyColumns = keyColumns == null ? null
                : Collections.unmodifiableList(new ArrayList<>(Arrays.asList(keyColumns)));
        return d;
    }

    /**
     * The types the records' values have, one per column, in the short names the native start-up
     * check reads ({@code decimal:10:2}, {@code timestamp_ltz:6}, ...). The SQL connector sets them
     * from the table's DDL, so that a PostgreSQL column that would change such values without an
     * error (round a fraction, read a timestamp in the session's time zone) stops the job at its
     * start, naming the column. Not for DataStream jobs: their records are the user's text.
     */
    @Internal
    public PostgresDestination withDeclaredColumnTypes(List<String> types) {
        PostgresDestination d = copy();
        d.declaredColumnTypes = Collections.unmodifiableList(new ArrayList<>(types));
        return d;
    }

    List<String> declaredColumnTypes() {
        // Null in an instance serialized by a release before the field (a job graph recovered
        // after an upgrade): no declared types, as then.
        return declaredColumnTypes == null ? Collections.emptyList() : declaredColumnTypes;
    }

    /**
     * Idempotent mode only: each record carries one more COPY field after the listed columns, the
     * operation: {@code U} upserts the row, {@code D} deletes the table's row with the record's key
     * (its other fields are ignored). Within a batch the last operation of each key wins, as it
     * would written one by one; a replay repeats the same upserts and deletes. The user needs the
     * DELETE privilege on the table. The SQL connector's upsert tables use it.
     */
    public PostgresDestination withOperationField() {
        PostgresDestination d = copy();
        d.operationField = true;
        return d;
    }

    /** The format of the rows the serialization schema writes; {@link PostgresCopyFormat#CSV} by default. */
    public PostgresDestination copyFormat(PostgresCopyFormat format) {
        PostgresDestination d = copy();
        d.copyFormat = format;
        return d;
    }

    /**
     * Transactional mode only: a {@code text} column of the table, not in {@link
     * #columns(String...)}, that the sink fills with each row's transaction id. Needed for {@link
     * RewindPolicy#REPLACE_RANGE}, which removes the rows of transactions committed after the
     * restored checkpoint; it also tells an operator which transaction wrote a row.
     */
    public PostgresDestination transactionIdColumn(String column) {
        PostgresDestination d = copy();
        d.transactionIdColumn = column;
        return d;
    }

    /**
     * The schema of the sink's own tables ({@code twopc_commit_records}, {@code twopc_prepared},
     * {@code twopc_expired}), created there when absent; {@code public} by default.
     */
    public PostgresDestination controlSchema(String schema) {
        PostgresDestination d = copy();
        d.controlSchema = schema;
        return d;
    }

    /** How long a connection attempt may take; 10 s by default. */
    public PostgresDestination connectTimeout(Duration timeout) {
        PostgresDestination d = copy();
        d.connectTimeout = timeout;
        return d;
    }

    // ------------------------------------------------------------------ read by the sink

    String url() {
        return url;
    }

    String host() {
        return host;
    }

    int port() {
        return port;
    }

    String database() {
        return database;
    }

    String user() {
        return user;
    }

    String table() {
        return table;
    }

    List<String> columnNames() {
        return columns;
    }

    PostgresMode mode() {
        return mode;
    }

    List<String> keyColumnNames() {
        return keyColumns;
    }

    boolean operationField() {
        return operationField;
    }

    PostgresCopyFormat copyFormat() {
        return copyFormat;
    }

    String transactionIdColumn() {
        return transactionIdColumn;
    }

    String controlSchema() {
        return controlSchema;
    }

    long connectTimeoutMs() {
        return connectTimeout.toMillis();
    }

    /**
     * Where task managers read the password: {@code env:NAME}, {@code property:NAME}, {@code
     * option:password} (it travels with the sink), or null.
     */
    String passwordSource() {
        if (passwordFromOption != null) {
            return "option:password";
        }
        if (passwordEnvironmentVariable != null) {
            return "env:" + passwordEnvironmentVariable;
        }
        return passwordSystemProperty != null ? "property:" + passwordSystemProperty : null;
    }

    /**
     * The password, read where the sink runs; null when none is configured.
     *
     * @throws TwopcConfigException when the configured variable or property is not set here
     */
    String resolvePassword() {
        if (passwordFromOption != null) {
            return passwordFromOption;
        }
        if (passwordEnvironmentVariable != null) {
            String value = System.getenv(passwordEnvironmentVariable);
            if (value == null) {
                throw new TwopcConfigException("the PostgreSQL password comes from environment variable "
                        + passwordEnvironmentVariable + ", which is not set on this task manager; set it "
                        + "in the task managers' environment");
            }
            return value;
        }
        if (passwordSystemProperty != null) {
            String value = System.getProperty(passwordSystemProperty);
            if (value == null) {
                throw new TwopcConfigException("the PostgreSQL password comes from system property "
                        + passwordSystemProperty + ", which is not set on this task manager; set it, e.g. "
                        + "with -D" + passwordSystemProperty + "=... in env.java.opts.taskmanager");
            }
            return value;
        }
        return null;
    }

    /** Every setting that cannot work, each with what to change; empty when all is well. */
    List<String> problems() {
        List<String> problems = new ArrayList<>();
        boolean hasUrl = url != null;
        boolean hasHost = host != null;
        if (hasUrl == hasHost) {
            problems.add("PostgreSQL server: " + (hasUrl ? "both a URL and a host are" : "neither a URL nor a host is")
                    + " set; use PostgresDestination.url(\"postgres://user@host:5432/db\") or "
                    + "PostgresDestination.host(host, port, database, user)");
        } else if (hasUrl) {
            if (url.trim().isEmpty()) {
                problems.add("PostgreSQL URL is empty; give postgres://user@host:5432/db");
            } else {
                String problem = connectionProblem(url);
                if (problem != null) {
                    problems.add(problem);
                }
            }
        } else {
            if (host.trim().isEmpty()) {
                problems.add("PostgreSQL host is empty; give the server's host name or address");
            }
            if (port < 1 || port > 65535) {
                problems.add("PostgreSQL port " + port + " is not a TCP port; use 1..65535 (5432 by default)");
            }
            if (database == null || database.trim().isEmpty()) {
                problems.add("PostgreSQL database is not set; give it in PostgresDestination.host(...)");
            }
            if (user == null || user.trim().isEmpty()) {
                problems.add("PostgreSQL user is not set; give it in PostgresDestination.host(...)");
            }
        }
        checkSettingName("password environment variable", passwordEnvironmentVariable, problems);
        checkSettingName("password system property", passwordSystemProperty, problems);
        if (passwordFromOption != null && passwordFromOption.isEmpty()) {
            problems.add("the PostgreSQL password is empty; give the password, or leave it out when the server "
                    + "asks for none");
        }

        if (table == null) {
            problems.add("PostgreSQL table is not set; call table(\"schema.table\") or table(\"table\")");
        } else {
            String[] parts = table.split("\\.", -1);
            if (parts.length > 2) {
                problems.add("PostgreSQL table \"" + table + "\" has more than one '.'; give table or schema.table");
            } else {
                for (String part : parts) {
                    checkName("table", part, problems);
                }
            }
        }
        if (columns == null || columns.isEmpty()) {
            problems.add("PostgreSQL columns are not set; call columns(...) with the table's columns in the "
                    + "order each record's values come");
        } else {
            checkNames("column", columns, problems);
        }
        if (mode == null) {
            problems.add("PostgreSQL mode is null; call transactional() or idempotent(keyColumns...)");
        } else if (mode == PostgresMode.IDEMPOTENT) {
            if (keyColumns == null || keyColumns.isEmpty()) {
                problems.add("idempotent mode needs key columns: idempotent(\"id\"), the columns of a primary key "
                        + "or unique index, so that a replay overwrites instead of adding rows");
            } else {
                checkNames("key column", keyColumns, problems);
                for (String key : keyColumns) {
                    if (key != null && columns != null && !columns.contains(key)) {
                        problems.add("key column \"" + key + "\" is not in columns " + columns
                                + "; every key column must be written, so add it to columns(...)");
                    }
                }
            }
            if (transactionIdColumn != null) {
                problems.add("transactionIdColumn applies to transactional mode only (in idempotent mode a "
                        + "replay overwrites by key); remove it");
            }
        } else if (operationField) {
            problems.add("withOperationField() applies to idempotent mode only (a transactional table takes "
                    + "inserts only); use idempotent(keyColumns...) or remove it");
        }
        if (transactionIdColumn != null) {
            checkName("transaction id column", transactionIdColumn, problems);
            if (columns != null && columns.contains(transactionIdColumn)) {
                problems.add("transaction id column \"" + transactionIdColumn + "\" is also in columns; remove it "
                        + "from columns(...): the sink fills it, the records do not carry it");
            }
        }
        if (copyFormat == null) {
            problems.add("PostgreSQL COPY format is null; use PostgresCopyFormat.CSV or PostgresCopyFormat.TEXT");
        }
        checkName("control schema", controlSchema, problems);
        // Compared, not converted: toMillis() overflows on a very large duration.
        if (connectTimeout == null || connectTimeout.compareTo(Duration.ofMillis(1)) < 0) {
            problems.add("PostgreSQL connect timeout " + connectTimeout + " must be at least 1 ms, e.g. "
                    + "Duration.ofSeconds(10)");
        } else if (connectTimeout.getSeconds() > Integer.MAX_VALUE) {
            problems.add("PostgreSQL connect timeout " + connectTimeout + " is too large");
        }
        return problems;
    }

    private static void checkNames(String what, List<String> names, List<String> problems) {
        Set<String> seen = new HashSet<>();
        for (String name : names) {
            checkName(what, name, problems);
            if (name != null && !seen.add(name)) {
                problems.add(what + " \"" + name + "\" is listed twice; list each once");
            }
        }
    }

    /** The checks the native side makes on every configured PostgreSQL name, made early. */
    private static void checkName(String what, String name, List<String> problems) {
        if (name == null || name.isEmpty()) {
            problems.add("PostgreSQL " + what + " is " + (name == null ? "null" : "empty") + "; give a name");
            return;
        }
        if (name.getBytes(StandardCharsets.UTF_8).length > MAX_NAME_BYTES) {
            problems.add("PostgreSQL " + what + " \"" + name + "\" is longer than " + MAX_NAME_BYTES
                    + " bytes; PostgreSQL would truncate it to another name");
        }
        if (!name.trim().equals(name)) {
            problems.add("PostgreSQL " + what + " \"" + name + "\" starts or ends with white space; names are "
                    + "used exactly as written, so remove it");
        }
        for (int i = 0; i < name.length(); i++) {
            if (Character.isISOControl(name.charAt(i))) {
                problems.add("PostgreSQL " + what + " \"" + name + "\" contains a control character; remove it");
                break;
            }
        }
    }

    private static void checkSettingName(String what, String name, List<String> problems) {
        if (name != null && name.trim().isEmpty()) {
            problems.add(what + " name is empty; give the name the password is read from");
        }
    }

    // ------------------------------------------------------------------ connection strings

    /**
     * Why a connection string cannot be used, or null. A URL is read with {@link URI} and also as
     * PostgreSQL's client reads it; it is refused when either reading finds a password, when a query
     * parameter names one, when an {@code @} outside the user part or a {@code #} fragment could make
     * the readings differ, or when its scheme is not {@code postgres}/{@code postgresql}. A
     * key=value string is parsed as the client parses it and refused when a keyword names a
     * password. The message never shows a password.
     */
    static String connectionProblem(String url) {
        if (!url.contains("://")) {
            return keyValueProblem(url);
        }
        String shown = maskUrl(url);
        String rest = null;
        for (String scheme : SCHEMES) {
            if (url.startsWith(scheme)) {
                rest = url.substring(scheme.length());
                break;
            }
        }
        if (rest == null) {
            return "PostgreSQL URL " + shown + " does not start with postgres:// or postgresql:// (in lower "
                    + "case); write postgres://user@host:port/dbname";
        }
        int at = rest.indexOf('@');
        if (at >= 0 && rest.substring(0, at).indexOf(':') >= 0) {
            return passwordRefused(shown, USERINFO);
        }
        URI uri;
        try {
            uri = new URI(url);
            new URI(withStandInForSocketDirectory(url, rest, uri.getRawAuthority())).parseServerAuthority();
        } catch (URISyntaxException e) {
            // The reason alone: the exception's message quotes the input.
            return "PostgreSQL URL " + shown + " is not a valid URL (" + e.getReason() + " at index "
                    + e.getIndex() + "); write postgres://user@host:port/dbname, percent-encoding special "
                    + "characters";
        }
        if (uri.getRawUserInfo() != null && uri.getRawUserInfo().indexOf(':') >= 0) {
            return passwordRefused(shown, USERINFO);
        }
        List<String> keys = new ArrayList<>();
        if (uri.getRawQuery() != null) {
            for (String param : uri.getRawQuery().split("&", -1)) {
                int eq = param.indexOf('=');
                String key = decode(eq < 0 ? param : param.substring(0, eq));
                if (isPasswordKey(key)) {
                    return passwordRefused(shown, "the parameter " + key);
                }
                if (!param.isEmpty()) {
                    // As the client reads a query: empty pieces ("a=1&&b=2") are no parameters.
                    keys.add(key);
                }
            }
        }
        // With at most one '@', and that one inside the authority, the client and a URL parser agree
        // on the user; otherwise the client would read a user (or a password) out of the path or query.
        int authorityEnd = rest.length();
        for (char c : new char[] {'/', '?', '#'}) {
            int i = rest.indexOf(c);
            if (i >= 0 && i < authorityEnd) {
                authorityEnd = i;
            }
        }
        long ats = rest.chars().filter(c -> c == '@').count();
        if (ats > (rest.substring(0, authorityEnd).indexOf('@') >= 0 ? 1 : 0)) {
            return "PostgreSQL URL " + shown + " holds an '@' outside its user part, where PostgreSQL's client "
                    + "would read what comes before it as user and password; write a literal @ in a user, "
                    + "database or parameter as %40";
        }
        if (uri.getRawFragment() != null) {
            return "PostgreSQL URL " + shown + " ends in a '#' fragment, which means nothing to PostgreSQL (its "
                    + "client would take it into the database name or a parameter); remove it, or write a "
                    + "literal # as %23";
        }
        // A setting given twice is taken by the client from the last place it reads, silently: the
        // sink would connect as another user, or to another database, than the rest says.
        String repeated = firstRepeated(keys);
        if (repeated != null) {
            return givenTwice(shown, repeated, "give each parameter once");
        }
        // The user part from the string itself: URI has none for a socket-directory host.
        if (at > 0 && at < authorityEnd && keys.contains("user")) {
            return givenTwice(shown, "user", "name it either before the '@' or in the parameter user, not both");
        }
        if (uri.getRawPath() != null && uri.getRawPath().length() > 1 && keys.contains("dbname")) {
            return givenTwice(shown, "dbname",
                    "name the database either in the path or in the parameter dbname, not both");
        }
        return null;
    }

    /** The first key that occurs again later in {@code keys}, or null. */
    private static String firstRepeated(List<String> keys) {
        for (int i = 0; i < keys.size(); i++) {
            if (keys.subList(i + 1, keys.size()).contains(keys.get(i))) {
                return keys.get(i);
            }
        }
        return null;
    }

    /** Keys that name where to connect: given twice, libpq takes the last, this sink's client both. */
    private static final List<String> HOST_KEYS = Arrays.asList("host", "hostaddr", "port");

    /** The refusal of a setting given twice; {@code shown} has any password masked. */
    private static String givenTwice(String shown, String key, String instead) {
        if (HOST_KEYS.contains(key)) {
            return "PostgreSQL connection string " + shown + " sets " + key + " twice, which PostgreSQL's clients "
                    + "read differently (libpq takes the last, this sink's client a list of both); give several as "
                    + "one list (" + key + "=a,b)";
        }
        return "PostgreSQL connection string " + shown + " sets " + key + " twice, and PostgreSQL's client would "
                + "silently take one of them; " + instead + " (with the SQL connector, the table option "
                + "'username' sets user: then leave the user out of 'url')";
    }

    /**
     * {@code url} with a host that is a percent-encoded socket directory ({@code %2Fvar%2Frun...},
     * as libpq writes it) replaced by a stand-in: {@link URI} takes no '%' in a host name, but the
     * rest of the authority (user, port) is still to be checked.
     */
    private static String withStandInForSocketDirectory(String url, String rest, String authority) {
        if (authority == null || !rest.startsWith(authority)) {
            return url;
        }
        int hostStart = authority.lastIndexOf('@') + 1;
        if (!authority.regionMatches(true, hostStart, "%2F", 0, 3)) {
            return url;
        }
        int portColon = authority.indexOf(':', hostStart);
        int hostEnd = portColon < 0 ? authority.length() : portColon;
        String scheme = url.substring(0, url.length() - rest.length());
        return scheme + authority.substring(0, hostStart) + "socket-directory" + authority.substring(hostEnd)
                + rest.substring(authority.length());
    }

    private static String passwordRefused(String shown, String what) {
        return "PostgreSQL URL " + shown + " carries a password (" + what + "); " + GIVE_IT_SEPARATELY;
    }

    private static String keyValueProblem(String connection) {
        List<String[]> pairs;
        try {
            pairs = parseKeyValue(connection);
        } catch (IllegalArgumentException e) {
            return "PostgreSQL connection string (not shown, as it may hold a password) is neither a "
                    + "postgres:// URL nor a valid key=value string (" + e.getMessage() + "); write "
                    + "postgres://user@host:port/dbname or host=... port=... dbname=... user=...";
        }
        for (String[] pair : pairs) {
            if (isPasswordKey(pair[0])) {
                return "PostgreSQL connection string " + renderKeyValue(pairs) + " sets " + pair[0] + "; "
                        + GIVE_IT_SEPARATELY;
            }
        }
        List<String> keys = new ArrayList<>();
        for (String[] pair : pairs) {
            keys.add(pair[0]);
        }
        String repeated = firstRepeated(keys);
        if (repeated != null) {
            return givenTwice(renderKeyValue(pairs), repeated, "give it once");
        }
        return null;
    }

    /** A parameter that names a password ({@code password}, {@code sslpassword}, in any case). */
    private static boolean isPasswordKey(String key) {
        return key.toLowerCase(Locale.ROOT).contains("password");
    }

    private static String decode(String s) {
        try {
            return URLDecoder.decode(s, StandardCharsets.UTF_8.name());
        } catch (UnsupportedEncodingException | IllegalArgumentException e) {
            return s;
        }
    }

    /**
     * Whether a key=value connection string names a user (for the SQL connector, whose
     * {@code 'username'} option adds one); false when it does not parse, which the builder reports.
     */
    @Internal
    public static boolean keyValueNamesUser(String connection) {
        try {
            return parseKeyValue(connection).stream().anyMatch(pair -> pair[0].equals("user"));
        } catch (IllegalArgumentException e) {
            return false;
        }
    }

    /**
     * Splits libpq's key=value form as PostgreSQL's client does: keywords end at white space or
     * {@code =}; white space may surround {@code =}; a value is single-quoted (a backslash escapes the
     * next character) or runs to the next white space (a backslash escapes there too).
     *
     * @throws IllegalArgumentException saying what is wrong, never showing a value
     */
    static List<String[]> parseKeyValue(String s) {
        List<String[]> pairs = new ArrayList<>();
        int i = 0;
        int n = s.length();
        while (true) {
            while (i < n && Character.isWhitespace(s.charAt(i))) {
                i++;
            }
            if (i >= n) {
                return pairs;
            }
            int keyStart = i;
            while (i < n && !Character.isWhitespace(s.charAt(i)) && s.charAt(i) != '=') {
                i++;
            }
            if (i == keyStart) {
                throw new IllegalArgumentException("an '=' without a keyword before it");
            }
            String key = s.substring(keyStart, i);
            while (i < n && Character.isWhitespace(s.charAt(i))) {
                i++;
            }
            if (i >= n || s.charAt(i) != '=') {
                throw new IllegalArgumentException("a keyword without '=' after it");
            }
            i++;
            while (i < n && Character.isWhitespace(s.charAt(i))) {
                i++;
            }
            StringBuilder value = new StringBuilder();
            if (i < n && s.charAt(i) == '\'') {
                i++;
                while (true) {
                    if (i >= n) {
                        throw new IllegalArgumentException("a quoted value without its closing quote");
                    }
                    char c = s.charAt(i++);
                    if (c == '\'') {
                        break;
                    }
                    if (c == '\\') {
                        if (i >= n) {
                            throw new IllegalArgumentException("a quoted value without its closing quote");
                        }
                        c = s.charAt(i++);
                    }
                    value.append(c);
                }
            } else {
                while (i < n && !Character.isWhitespace(s.charAt(i))) {
                    char c = s.charAt(i++);
                    if (c == '\\') {
                        if (i < n) {
                            value.append(s.charAt(i++));
                        }
                    } else {
                        value.append(c);
                    }
                }
                if (value.length() == 0) {
                    throw new IllegalArgumentException("a keyword without a value");
                }
            }
            pairs.add(new String[] {key, value.toString()});
        }
    }

    /** Key=value pairs as a string, password values masked, quoted where needed. */
    private static String renderKeyValue(List<String[]> pairs) {
        StringBuilder out = new StringBuilder();
        for (String[] pair : pairs) {
            if (out.length() > 0) {
                out.append(' ');
            }
            String key = pair[0];
            String value = pair[1];
            if (isPasswordKey(key)) {
                out.append(key).append("=***");
            } else if (value.isEmpty() || value.chars().anyMatch(c -> Character.isWhitespace(c) || c == '\'' || c == '\\')) {
                out.append(key).append("='").append(value.replace("\\", "\\\\").replace("'", "\\'")).append('\'');
            } else {
                out.append(key).append('=').append(value);
            }
        }
        return out.toString();
    }

    /**
     * A connection string as it may be shown in messages and logs: an accepted one as it is (it
     * holds no password), anything else with every part that some reading could take for a
     * password masked.
     */
    static String redact(String connection) {
        if (connection == null) {
            return null;
        }
        if (connection.contains("://")) {
            return connectionProblem(connection) == null ? connection : maskUrl(connection);
        }
        try {
            return renderKeyValue(parseKeyValue(connection));
        } catch (IllegalArgumentException e) {
            return "(a key=value connection string that does not parse; not shown, as it may hold a password)";
        }
    }

    /**
     * A URL with the user information up to the last {@code @} (after the user's name), password
     * parameters and any fragment masked.
     */
    private static String maskUrl(String url) {
        int schemeEnd = url.indexOf("://");
        if (schemeEnd < 0) {
            return "(not shown)";
        }
        StringBuilder out = new StringBuilder(url.substring(0, schemeEnd + 3));
        String rest = url.substring(schemeEnd + 3);
        int last = rest.lastIndexOf('@');
        if (last >= 0) {
            if (rest.substring(0, last).indexOf(':') < 0) {
                // Without a ':' before it, no reading finds a password there.
                out.append(rest, 0, last + 1);
            } else {
                int userEnd = last;
                for (char c : new char[] {':', '@'}) {
                    int i = rest.indexOf(c);
                    if (i >= 0 && i < userEnd) {
                        userEnd = i;
                    }
                }
                out.append(rest, 0, userEnd).append(":***@");
            }
            rest = rest.substring(last + 1);
        }
        boolean fragment = false;
        int hash = rest.indexOf('#');
        if (hash >= 0) {
            rest = rest.substring(0, hash);
            fragment = true;
        }
        int question = rest.indexOf('?');
        if (question < 0) {
            out.append(rest);
        } else {
            out.append(rest, 0, question + 1);
            String[] params = rest.substring(question + 1).split("&", -1);
            for (int i = 0; i < params.length; i++) {
                if (i > 0) {
                    out.append('&');
                }
                int eq = params[i].indexOf('=');
                if (eq >= 0 && isPasswordKey(decode(params[i].substring(0, eq)))) {
                    out.append(params[i], 0, eq).append("=***");
                } else {
                    out.append(params[i]);
                }
            }
        }
        if (fragment) {
            out.append("#***");
        }
        return out.toString();
    }

    private PostgresDestination copy() {
        PostgresDestination d = new PostgresDestination();
        d.url = url;
        d.host = host;
        d.port = port;
        d.database = database;
        d.user = user;
        d.passwordEnvironmentVariable = passwordEnvironmentVariable;
        d.passwordSystemProperty = passwordSystemProperty;
        d.passwordFromOption = passwordFromOption;
        d.table = table;
        d.columns = columns;
        d.mode = mode;
        d.keyColumns = keyColumns;
        d.operationField = operationField;
        d.declaredColumnTypes = declaredColumnTypes;
        d.copyFormat = copyFormat;
        d.transactionIdColumn = transactionIdColumn;
        d.controlSchema = controlSchema;
        d.connectTimeout = connectTimeout;
        return d;
    }

    /** The settings, for logs: never a password (a URL is shown with any password masked). */
    @Override
    public String toString() {
        StringBuilder s = new StringBuilder("PostgreSQL ");
        s.append(url != null ? redact(url) : host + ":" + port + "/" + database + " as " + user);
        s.append(" table ").append(table).append(' ').append(columns);
        s.append(", ").append(mode);
        if (mode == PostgresMode.IDEMPOTENT) {
            s.append(" on ").append(keyColumns);
            if (operationField) {
                s.append(" with deletes");
            }
        }
        s.append(", COPY ").append(copyFormat);
        if (transactionIdColumn != null) {
            s.append(", transaction id in ").append(transactionIdColumn);
        }
        s.append(", control schema ").append(controlSchema);
        if (passwordEnvironmentVariable != null) {
            s.append(", password from environment variable ").append(passwordEnvironmentVariable);
        } else if (passwordSystemProperty != null) {
            s.append(", password from system property ").append(passwordSystemProperty);
        } else if (passwordFromOption != null) {
            s.append(", password from the table option");
        }
        return s.toString();
    }
}
